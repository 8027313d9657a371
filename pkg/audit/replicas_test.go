package audit_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// BenchmarkAuditPublishReplicas is the audit publish throughput a host's service sees on a
// single-host bus (the audit stream at R1) and on a node of a three-node TLS cluster on
// loopback (R3, each event acknowledged once a second node has it): per round, the netstack's
// spooled publisher with the services' limits takes a fixed number of distinct events from
// many sandboxes (within every sandbox's burst, so none is folded) and Close waits for every
// acknowledgement. ratio is R3's events/s over R1's, both measured in the same run.
func BenchmarkAuditPublishReplicas(b *testing.B) {
	const events, sandboxes = 20000, 40
	single := testutil.NewBus(b)
	cluster := testutil.NewBusCluster(b, bus.ClusterReplicas)
	buses := []struct {
		name string
		bus  *testutil.Bus
		secs float64
	}{{name: "R1", bus: single}, {name: "R3", bus: cluster.Nodes[0]}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for i := range buses {
		if r, err := bus.Replicas(ctx, buses[i].bus.Connect(b, bus.UserAdmin), bus.StreamAudit); err != nil || fmt.Sprintf("R%d", r) != buses[i].name {
			b.Fatalf("the %s bus's audit stream has %d replicas (%v)", buses[i].name, r, err)
		}
	}
	dir := b.TempDir()
	b.ResetTimer()
	for round := range b.N {
		for i := range buses {
			tb := &buses[i]
			js, err := jetstream.New(tb.bus.Connect(b, bus.UserAdmin))
			if err != nil {
				b.Fatal(err)
			}
			st, err := js.Stream(ctx, bus.StreamAudit)
			if err != nil {
				b.Fatal(err)
			}
			before := st.CachedInfo().State.Msgs
			spool := filepath.Join(dir, fmt.Sprintf("%s-%d.spool", tb.name, round))
			p, err := audit.NewSpooledPublisher(tb.bus.Connect(b, bus.UserNetstack), bus.UserNetstack, zerolog.Nop(), spool)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			for n := range events {
				p.Emit(ctx, audit.Event{Sandbox: fmt.Sprintf("sb-%d-%d", round, n%sandboxes), Name: "bench", Layer: audit.LayerHTTP,
					Host: "registry.npmjs.org", Method: "GET", Path: fmt.Sprintf("/pkg-%d", n), Status: 200, Decision: audit.Allow, Rule: "allowlist"})
			}
			if err := p.Close(ctx); err != nil {
				b.Fatalf("%s: close the publisher: %v", tb.name, err)
			}
			tb.secs += time.Since(start).Seconds()
			info, err := st.Info(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if got := info.State.Msgs - before; got != events {
				b.Fatalf("%s: the audit stream took %d of the round's %d events", tb.name, got, events)
			}
		}
	}
	r1 := float64(events*b.N) / buses[0].secs
	r3 := float64(events*b.N) / buses[1].secs
	b.ReportMetric(r1, "R1-events/s")
	b.ReportMetric(r3, "R3-events/s")
	b.ReportMetric(r3/r1, "ratio")
}
