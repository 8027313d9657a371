package gateway

import (
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// TestIdleSweep: a running sandbox with --idle-timeout and nothing going on is paused once the
// timeout passes with the reason on its record; activity from a caller restarts the clock; an
// exec resumes a sandbox that idleness paused. One without a timeout is never paused.
func TestIdleSweep(t *testing.T) {
	tg := newTestGateway(t)
	ctx, g := tg.ctx, tg.Service
	g.idle = &idleWatch{last: map[string]idleSample{}}
	add := func(name, idle string) *api.Sandbox {
		return tg.add(t, &api.Sandbox{Name: name, IdleTimeout: idle, VCPUs: 1}, api.StateRunning)
	}
	idle := add("idle/box", "10s")
	busy := add("idle/never", "")
	state := func(sb *api.Sandbox) *api.Sandbox { return tg.get(t, sb) }
	start := time.Now()
	g.sweepIdle(ctx, start.Add(-20*time.Second)) // first sight: the clock starts
	g.touch(idle.ID)                             // an exec now
	g.sweepIdle(ctx, start.Add(time.Second))
	if st := state(idle); st.State != api.StateRunning {
		t.Fatalf("paused %v after an exec: %s %q", time.Second, st.State, st.Reason)
	}
	g.sweepIdle(ctx, start.Add(11*time.Second))
	st := state(idle)
	if st.State != api.StatePaused || !strings.Contains(st.Reason, "no activity for 10s") {
		t.Fatalf("idle for 11s with a 10s timeout: %s %q", st.State, st.Reason)
	}
	if st := state(busy); st.State != api.StateRunning {
		t.Fatalf("a sandbox without --idle-timeout became %s", st.State)
	}
	// The next exec resumes it.
	got, err := g.running(ctx, idle.Name)
	if err != nil || got.State != api.StateRunning || state(idle).State != api.StateRunning {
		t.Fatalf("exec on an idle-paused sandbox: %v (%v)", err, state(idle).State)
	}
	// A pause the user asked for is not undone by an exec.
	cur := state(idle)
	if err := g.pause(ctx, cur, false); err != nil {
		t.Fatal(err)
	}
	if _, err := g.running(ctx, idle.Name); err == nil {
		t.Fatal("exec resumed a sandbox the user paused")
	}
}

// TestBusyPercent: the guest's own ticks decide when it reports them (a TCG host burning 8% on
// an idle guest is idle); the host's CPU time is the fallback for an older agent.
func TestBusyPercent(t *testing.T) {
	t0 := time.Now()
	prev := idleSample{at: t0, cpu: 10, gbusy: 1000, gtotal: 10000}
	idle := idleSample{at: t0.Add(5 * time.Second), cpu: 10.4, gbusy: 1002, gtotal: 10500} // host 8%, guest 0.4%
	if p := busyPercent(prev, idle, 1); p >= IdleCPUPercent {
		t.Errorf("an idle guest on a busy emulator: %.1f%%", p)
	}
	busy := idleSample{at: t0.Add(5 * time.Second), cpu: 14, gbusy: 1400, gtotal: 10500}
	if p := busyPercent(prev, busy, 1); p < 50 {
		t.Errorf("a guest busy 80%% of its ticks: %.1f%%", p)
	}
	old := idleSample{at: t0, cpu: 10}
	if p := busyPercent(old, idleSample{at: t0.Add(5 * time.Second), cpu: 12.5}, 1); p < 49 || p > 51 {
		t.Errorf("fallback to host CPU: %.1f%%, want 50", p)
	}
	if p := busyPercent(old, idleSample{at: t0.Add(5 * time.Second), cpu: 12.5}, 2); p < 24 || p > 26 {
		t.Errorf("fallback over 2 vCPUs: %.1f%%, want 25", p)
	}
}
