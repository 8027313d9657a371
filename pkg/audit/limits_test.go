package audit

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

type written struct {
	ev      Event
	summary bool
}

func newTestLimiter(l Limits) (*limiter, *[]written) {
	var out []written
	return newLimiter(l, func(ev Event, s bool) { out = append(out, written{ev, s}) }), &out
}

// TestIdenticalDecisionsAreFolded: the first of identical decisions is written at once, the
// repeats within the window as one event with their count and first and last times.
func TestIdenticalDecisionsAreFolded(t *testing.T) {
	lm, out := newTestLimiter(Limits{Rate: 100, Burst: 100, Window: time.Second})
	t0 := time.Unix(1000, 0)
	ev := Event{Sandbox: "sb-1", Layer: LayerDNS, Host: "x.example", Decision: Deny, Rule: "not_allowed"}
	for i := range 50 {
		ev.Time = t0.Add(time.Duration(i) * 10 * time.Millisecond)
		got := lm.admit(ev, ev.Time)
		if got != (i == 0) {
			t.Fatalf("event %d admitted=%v", i, got)
		}
	}
	other := Event{Sandbox: "sb-1", Layer: LayerDNS, Host: "y.example", Decision: Deny, Time: t0}
	if !lm.admit(other, t0) {
		t.Fatal("a different decision was folded")
	}
	lm.tick(t0.Add(500*time.Millisecond), false)
	if len(*out) != 0 {
		t.Fatalf("written before the window ended: %+v", *out)
	}
	lm.tick(t0.Add(time.Second), false)
	if len(*out) != 1 {
		t.Fatalf("after the window: %+v", *out)
	}
	agg := (*out)[0].ev
	if agg.Count != 49 || agg.Host != "x.example" || !agg.First.Equal(t0.Add(10*time.Millisecond)) || !agg.Last.Equal(t0.Add(490*time.Millisecond)) || (*out)[0].summary {
		t.Fatalf("folded event %+v", agg)
	}
	// A decision repeated forever: one event per window.
	for w := 1; w <= 3; w++ {
		base := t0.Add(time.Duration(w) * time.Second)
		for i := range 10 {
			ev.Time = base.Add(time.Duration(i) * time.Millisecond)
			if lm.admit(ev, ev.Time) {
				t.Fatalf("window %d: a repeat was written on its own", w)
			}
		}
		lm.tick(base.Add(time.Second), false)
	}
	if len(*out) != 4 || (*out)[3].ev.Count != 10 {
		t.Fatalf("steady repeats: %+v", *out)
	}
}

// TestRateLimitSummarises: past its burst a sandbox's events are counted, not written, and one
// `suppressed` summary per decision says how many and when; another sandbox is not affected.
func TestRateLimitSummarises(t *testing.T) {
	lm, out := newTestLimiter(Limits{Rate: 10, Burst: 20, Window: time.Second})
	t0 := time.Unix(1000, 0)
	admitted := 0
	for i := range 1000 {
		now := t0.Add(time.Duration(i) * time.Millisecond) // 1000 a second for a second
		ev := Event{Time: now, Sandbox: "sb-flood", Name: "flood", Layer: LayerDNS, Host: fmt.Sprintf("n%d.example", i), Decision: Deny}
		if i%10 == 0 {
			ev.Decision, ev.Layer = Allow, LayerHTTP
		}
		if lm.admit(ev, now) {
			admitted++
		}
	}
	// Burst 20 plus 10 a second over the second.
	if admitted < 20 || admitted > 31 {
		t.Fatalf("admitted %d of 1000", admitted)
	}
	if !lm.admit(Event{Sandbox: "sb-quiet", Layer: LayerHTTP, Decision: Allow, Time: t0}, t0.Add(time.Second)) {
		t.Fatal("another sandbox was limited")
	}
	lm.tick(t0.Add(time.Second), false)
	var suppressed int64
	for _, w := range *out {
		if !w.summary {
			t.Fatalf("not a summary: %+v", w)
		}
		ev := w.ev
		if ev.Rule != RuleSuppressed || ev.Layer != LayerAudit || ev.Sandbox != "sb-flood" || ev.Name != "flood" || ev.First == nil || ev.Last == nil ||
			!strings.Contains(ev.Reason, "audit limit of 10 a second") {
			t.Fatalf("summary %+v", ev)
		}
		suppressed += ev.Count
	}
	if len(*out) != 2 || suppressed != int64(1000-admitted) {
		t.Fatalf("%d summaries counting %d, want 2 counting %d", len(*out), suppressed, 1000-admitted)
	}
	// The next summary waits for the next window.
	*out = nil
	for i := range 5 {
		lm.admit(Event{Sandbox: "sb-flood", Host: fmt.Sprint("more", i), Decision: Deny, Time: t0}, t0.Add(1100*time.Millisecond))
	}
	lm.tick(t0.Add(1500*time.Millisecond), false)
	if len(*out) != 0 {
		t.Fatalf("a second summary within the window: %+v", *out)
	}
	lm.tick(t0.Add(2*time.Second), true)
	if len(*out) == 0 {
		t.Fatal("the final tick left the count unwritten")
	}
}

func TestEventFieldsAreBounded(t *testing.T) {
	ev := Event{Host: strings.Repeat("a", 5000), Path: strings.Repeat("/é", 5000), Reason: strings.Repeat("r", 5000)}
	clip(&ev)
	if len(ev.Host) > maxHostLen+4 || len(ev.Path) > maxPathLen+4 || len(ev.Reason) > maxReasonLen+4 || !strings.HasSuffix(ev.Path, "…") {
		t.Fatalf("host %d path %d reason %d bytes", len(ev.Host), len(ev.Path), len(ev.Reason))
	}
}
