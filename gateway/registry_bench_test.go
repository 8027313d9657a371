package gateway

import (
	"context"
	"fmt"
	"testing"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
)

// BenchmarkPS10000 is `nexus ps -a` against a registry of 10,000 synthetic records: the CLI's
// call over the bus, the gateway's listing and the reply, as the CLI gets it (no VM runs, so
// the vmm's columns are empty).
func BenchmarkPS10000(b *testing.B) {
	const n = 10000
	tb := testutil.NewBus(b)
	nc := tb.Connect(b, bus.UserGateway)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg, err := NewRegistry(ctx, nc)
	if err != nil {
		b.Fatal(err)
	}
	g := &Service{cfg: Config{Bus: nc, Home: tb.Home, Host: bus.LocalHost}, reg: reg, log: zerolog.Nop()}
	for i := range n {
		sb := &api.Sandbox{Name: fmt.Sprintf("bench/sb-%05d", i), Image: "nexus-mini", Host: bus.LocalHost, Agent: "claude-code",
			MemoryMiB: 256, VCPUs: 1, Labels: map[string]string{"team": fmt.Sprint(i % 7)}, Egress: api.Egress{Mode: api.EgressCurated}}
		if err := reg.Create(ctx, sb); err != nil {
			b.Fatal(err)
		}
	}
	svc, err := bus.NewService(nc, bus.ServiceInfo{Name: "gateway", Version: "0.0.1", Host: bus.LocalHost}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	if err := api.List.Serve(svc, g.list); err != nil {
		b.Fatal(err)
	}
	cli := api.NewClient(tb.Connect(b, bus.UserCLI))
	b.ResetTimer()
	for range b.N {
		list, err := cli.List(ctx, api.ListRequest{All: true})
		if err != nil {
			b.Fatal(err)
		}
		if len(list) != n {
			b.Fatalf("ps listed %d of %d sandboxes", len(list), n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/ps")
}
