package snapshot_test

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// guestClock reads the guest's wall clock and clocksource, and the host's clock around the read.
func guestClock(t *testing.T, name string) (guest, before, after time.Time, clocksource string) {
	t.Helper()
	before = time.Now()
	out := stack.MustNexus(t, "exec", name, "--", "sh", "-c", "date +%s; cat /sys/devices/system/clocksource/clocksource0/current_clocksource")
	after = time.Now()
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("%s: clock probe printed %q", name, out)
	}
	sec, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		t.Fatalf("%s: date printed %q", name, f[0])
	}
	return time.Unix(sec, 0), before, after, f[1]
}

// A sandbox's guest clock tells the host's time and keeps it, booted cold, restored from a
// template and forked from a snapshot taken a while before; it runs on the TSC, not on jiffies,
// which lose time when the host is busy (and keep the idle guest's tick running).
func TestGuestClockRightAfterRestoreAndFork(t *testing.T) {
	create(t, "clock/cold") // cold unless another test built the template already; it builds it
	templateOf(t)
	create(t, "clock/warm")
	snapshot(t, "clock/warm", "clock-snap")
	time.Sleep(3 * time.Second) // the fork restores a guest whose clock stopped this long ago
	fork(t, "clock-snap", "clock/fork")
	for _, name := range []string{"clock/cold", "clock/warm", "clock/fork"} {
		g1, b1, a1, cs := guestClock(t, name)
		if cs != "tsc" {
			t.Errorf("%s: the guest's clocksource is %s, want tsc", name, cs)
		}
		// date +%s truncates: the guest's second starts at most a second before the host's read.
		if g1.Before(b1.Add(-2*time.Second)) || g1.After(a1.Add(time.Second)) {
			t.Errorf("%s: guest clock %s, host %s to %s", name, g1.Format(time.TimeOnly), b1.Format(time.TimeOnly), a1.Format(time.TimeOnly))
		}
		time.Sleep(5 * time.Second) // the clock must keep time over a while, not just be set
		g2, b2, a2, _ := guestClock(t, name)
		if lo, hi := b2.Sub(a1)-2*time.Second, a2.Sub(b1)+2*time.Second; g2.Sub(g1) < lo || g2.Sub(g1) > hi {
			t.Errorf("%s: the guest clock moved %s while the host's moved %s to %s", name, g2.Sub(g1), lo+2*time.Second, hi-2*time.Second)
		}
	}
}
