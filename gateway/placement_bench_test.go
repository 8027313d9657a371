package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/profile"
)

// BenchmarkPlacement is the gateway's placement of one create (reading the hosts' heartbeats
// from nexus_hosts and choosing) with one host heartbeating and with three, each on its own
// bus, each iteration one placement of each so that both see the same noise. ratio is three
// hosts' time over one host's.
func BenchmarkPlacement(b *testing.B) {
	prof, err := profile.Get(profile.DefaultName)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gateway := func(n int) *Service {
		tb := testutil.NewBus(b)
		g := &Service{cfg: Config{Bus: tb.Connect(b, bus.UserGateway), Home: tb.Home, Host: bus.LocalHost}, log: zerolog.Nop()}
		kv, err := bus.KV(ctx, tb.Connect(b, bus.UserAdmin), bus.KVHosts)
		if err != nil {
			b.Fatal(err)
		}
		for i, h := range []string{bus.LocalHost, "b", "c"}[:n] {
			if err := bus.Beat(ctx, kv, bus.HostBeat{Host: h, MemoryMiB: 8192, MemoryUsedMiB: 1024 * i, At: time.Now().Add(time.Hour)}); err != nil {
				b.Fatal(err)
			}
		}
		return g
	}
	gws := []struct {
		g       *Service
		elapsed time.Duration
	}{{g: gateway(1)}, {g: gateway(3)}}
	place := func(g *Service) {
		sb := &api.Sandbox{Name: "bench/p", MemoryMiB: 1024}
		if err := g.place(ctx, sb, api.CreateRequest{}, prof); err != nil || sb.Host != bus.LocalHost {
			b.Fatalf("placed on %q, %v; want %s (the most free memory)", sb.Host, err, bus.LocalHost)
		}
	}
	for range 50 { // the bucket's first reads are slower: not what a running gateway sees
		for _, gw := range gws {
			place(gw.g)
		}
	}
	b.ResetTimer()
	for range b.N {
		for i := range gws {
			start := time.Now()
			place(gws[i].g)
			gws[i].elapsed += time.Since(start)
		}
	}
	us := func(i int) float64 { return float64(gws[i].elapsed.Microseconds()) / float64(b.N) }
	b.ReportMetric(us(0), "1-host-µs/place")
	b.ReportMetric(us(1), "3-hosts-µs/place")
	b.ReportMetric(us(1)/us(0), "ratio")
}
