package gateway

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/profile"
)

// BenchmarkPlacement is the gateway's placement of one create (reading the hosts' heartbeats
// from nexus_hosts and choosing), with one host and with three heartbeating; ratio-1-host is
// how much dearer three hosts make it.
func BenchmarkPlacement(b *testing.B) {
	prof, err := profile.Get(profile.DefaultName)
	if err != nil {
		b.Fatal(err)
	}
	var one float64
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("%d-hosts", n), func(b *testing.B) {
			tb := testutil.NewBus(b)
			nc := tb.Connect(b, bus.UserGateway)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := &Service{cfg: Config{Bus: nc, Home: tb.Home, Host: bus.LocalHost}, log: zerolog.Nop()}
			kv, err := bus.KV(ctx, tb.Connect(b, bus.UserAdmin), bus.KVHosts)
			if err != nil {
				b.Fatal(err)
			}
			hosts := []string{bus.LocalHost, "b", "c"}[:n]
			for i, h := range hosts {
				if err := bus.Beat(ctx, kv, bus.HostBeat{Host: h, MemoryMiB: 8192, MemoryUsedMiB: 1024 * i, At: time.Now().Add(time.Hour)}); err != nil {
					b.Fatal(err)
				}
			}
			for range 20 { // the bucket's first reads are slower: not what a running gateway sees
				g.place(ctx, &api.Sandbox{Name: "bench/p", MemoryMiB: 1024}, api.CreateRequest{}, prof)
			}
			b.ResetTimer()
			for range b.N {
				sb := &api.Sandbox{Name: "bench/p", MemoryMiB: 1024}
				if err := g.place(ctx, sb, api.CreateRequest{}, prof); err != nil || sb.Host != bus.LocalHost {
					b.Fatalf("placed on %q, %v; want %s (the most free memory)", sb.Host, err, bus.LocalHost)
				}
			}
			us := float64(b.Elapsed().Microseconds()) / float64(b.N)
			b.ReportMetric(us, "µs/place")
			if n == 1 {
				one = us
			} else if one > 0 {
				b.ReportMetric(us/one, "ratio-1-host")
			}
		})
	}
}
