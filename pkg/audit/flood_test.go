package audit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// floodFor emits, as fast as the publisher takes them, what a guest looping over NXDOMAIN
// lookups of long random names makes the netstack emit, plus one denial repeated (a retrying
// connect), for d. It returns how many events it emitted.
func floodFor(p *audit.Publisher, sandbox string, d time.Duration) int64 {
	label := strings.Repeat("x", 60)
	var n int64
	for end := time.Now().Add(d); time.Now().Before(end); n += 2 {
		host := fmt.Sprintf("%s.%s.%s.%d.flood.example", label, label, label, n)
		p.Emit(context.Background(), audit.Event{Sandbox: sandbox, Name: "flooder", Layer: audit.LayerDNS, Proto: "udp", Host: host,
			Decision: audit.Deny, Rule: "dns_not_allowed", Reason: "name is not on the allowlist"})
		p.Emit(context.Background(), audit.Event{Sandbox: sandbox, Name: "flooder", Layer: audit.LayerL4, Proto: "tcp", IP: "10.9.9.9", Port: 443,
			Decision: audit.Deny, Rule: "l4_not_allowed", Reason: "address is not on the allowlist"})
	}
	return n
}

func readSandbox(t testing.TB, b *testutil.Bus, id string) []audit.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []audit.Event
	err := audit.Tail(ctx, b.Connect(t, bus.UserCLI), audit.TailOptions{Sandboxes: []string{id}}, func(ev audit.Event) error {
		out = append(out, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFloodDoesNotEraseOthers: one sandbox floods denials at full speed while another makes a
// few ordinary requests. Every event of the second is in the stream; the flooder's are folded
// and summarised so that each one it made is accounted for, and what it wrote is bounded by
// its rate.
func TestFloodDoesNotEraseOthers(t *testing.T) {
	b := testutil.NewBus(t)
	limits := audit.Limits{Rate: 50, Burst: 100, Window: 200 * time.Millisecond}
	p, err := audit.NewPublisher(b.Connect(t, bus.UserNetstack), bus.UserNetstack, zerolog.Nop(), audit.WithLimits(limits))
	if err != nil {
		t.Fatal(err)
	}
	const d = 1500 * time.Millisecond
	done := make(chan int64)
	start := time.Now()
	go func() { done <- floodFor(p, "sb-flood", d) }()
	const quiet = 5
	for i := range quiet {
		p.Emit(context.Background(), audit.Event{Sandbox: "sb-quiet", Name: "quiet", Layer: audit.LayerHTTP, Host: "registry.npmjs.org",
			Method: "GET", Path: fmt.Sprintf("/pkg-%d", i), Status: 200, Decision: audit.Allow, Rule: "allowlist"})
		time.Sleep(d / quiet) // pacing the ordinary requests, not waiting for an outcome
	}
	emitted := <-done
	elapsed := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}

	got := readSandbox(t, b, "sb-quiet")
	if len(got) != quiet {
		t.Fatalf("the quiet sandbox has %d events in the stream, want %d", len(got), quiet)
	}
	for i, ev := range got {
		if ev.Path != fmt.Sprintf("/pkg-%d", i) || ev.Name != "quiet" || ev.Count != 0 {
			t.Errorf("quiet event %d: %+v", i, ev)
		}
	}

	var stored, accounted, summaries, folded int64
	for _, ev := range readSandbox(t, b, "sb-flood") {
		stored++
		switch {
		case ev.Rule == audit.RuleSuppressed:
			summaries++
			accounted += ev.Count
			if ev.Layer != audit.LayerAudit || ev.Decision != audit.Deny || ev.First == nil || ev.Last == nil || ev.Last.Before(*ev.First) {
				t.Errorf("summary %+v", ev)
			}
		case ev.Count > 0:
			folded++
			accounted += ev.Count
			if ev.Layer != audit.LayerL4 || ev.First == nil || ev.Last == nil {
				t.Errorf("folded event %+v", ev)
			}
		default:
			accounted++
		}
	}
	t.Logf("flood: %d events emitted in %v; %d stored (%d folded, %d summaries)", emitted, elapsed, stored, folded, summaries)
	if accounted != emitted {
		t.Errorf("the stream accounts for %d of the flooder's %d events", accounted, emitted)
	}
	if folded == 0 || summaries == 0 {
		t.Errorf("%d folded events and %d summaries, want some of each", folded, summaries)
	}
	// Its burst, its rate over the flood, one summary per window: nothing more.
	windows := int64(elapsed/limits.Window) + 2
	if bound := int64(limits.Burst) + int64(limits.Rate*elapsed.Seconds()) + windows + 1; stored > bound {
		t.Errorf("the flooder stored %d events, more than its bound %d", stored, bound)
	}
}

// TestStreamKeepsEachSandboxHistory: even a writer that is not limited (a service from an older
// build, or one publishing directly) evicts only its own subject's oldest events: the per-subject
// limit keeps every other sandbox's.
func TestStreamKeepsEachSandboxHistory(t *testing.T) {
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserNetstack)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ev, _ := json.Marshal(audit.Event{Sandbox: "sb-quiet", Layer: audit.LayerHTTP, Decision: audit.Allow, Host: "keep.example"})
	if _, err := js.Publish(ctx, audit.Subject(bus.UserNetstack, "sb-quiet"), ev); err != nil {
		t.Fatal(err)
	}
	flood, _ := json.Marshal(audit.Event{Sandbox: "sb-flood", Layer: audit.LayerDNS, Decision: audit.Deny, Host: "x.example"})
	for i := range bus.AuditPerSubject + 500 {
		if _, err := js.PublishAsync(audit.Subject(bus.UserNetstack, "sb-flood"), flood); err != nil {
			t.Fatal(err)
		}
		if i%2000 == 1999 || i == bus.AuditPerSubject+499 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("flood not acknowledged")
			}
		}
	}
	if got := readSandbox(t, b, "sb-quiet"); len(got) != 1 || got[0].Host != "keep.example" {
		t.Fatalf("the quiet sandbox's history after the flood: %+v", got)
	}
	if got := len(readSandbox(t, b, "sb-flood")); got != bus.AuditPerSubject {
		t.Fatalf("the flooder keeps %d events, want its last %d", got, bus.AuditPerSubject)
	}
}

// BenchmarkAuditFlood measures the bytes a second a flooding sandbox adds to the audit stream
// through a publisher with the default limits and through one without, in the same run, once
// the limited one's burst is spent (from the second to the fifth second of the flood), and
// states the bound the limits guarantee.
func BenchmarkAuditFlood(b *testing.B) {
	const settle, d = 2 * time.Second, 5 * time.Second
	rate := func(l audit.Limits) (float64, int64) {
		bb := testutil.NewBus(b)
		p, err := audit.NewPublisher(bb.Connect(b, bus.UserNetstack), bus.UserNetstack, zerolog.Nop(), audit.WithLimits(l))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		js, _ := jetstream.New(bb.Connect(b, bus.UserAdmin))
		st, err := js.Stream(ctx, bus.StreamAudit)
		if err != nil {
			b.Fatal(err)
		}
		stored := func() uint64 {
			info, err := st.Info(ctx)
			if err != nil {
				b.Fatal(err)
			}
			return info.State.Bytes
		}
		done := make(chan int64)
		go func() { done <- floodFor(p, "sb-flood", d) }()
		time.Sleep(settle) // measuring a window of the flood, not waiting for an outcome
		b1, t1 := stored(), time.Now()
		n := <-done
		b2, t2 := stored(), time.Now()
		if err := p.Close(ctx); err != nil {
			b.Fatal(err)
		}
		return float64(b2-b1) / t2.Sub(t1).Seconds(), n
	}
	for range b.N {
		limited, n1 := rate(audit.DefaultLimits)
		unlimited, n2 := rate(audit.Unlimited)
		b.ReportMetric(limited, "limited-B/s")
		b.ReportMetric(unlimited, "unlimited-B/s")
		b.ReportMetric(unlimited/limited, "ratio")
		b.ReportMetric(audit.FloodBound(audit.DefaultLimits), "bound-B/s")
		b.ReportMetric(float64(n1+n2)/2/d.Seconds(), "emitted/s")
	}
}
