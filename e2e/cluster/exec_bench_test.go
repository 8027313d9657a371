package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
)

// benchHosts is the two-host cluster the benchmarks share, with a sandbox on each host. go test
// calls a benchmark once with b.N=1 and again with the count asked for: the cluster and its
// creates are made once per process and removed by TestMain (closeBench).
var benchHosts struct {
	once    sync.Once
	c       *cluster
	nc      *nats.Conn // h1's CLI user, connected from inside h1's namespace
	local   string     // the sandbox on h1
	remote  string     // the sandbox on h2
	failure string
}

func twoHosts(b *testing.B) {
	b.Helper()
	benchHosts.once.Do(func() {
		benchHosts.failure = "the two-host cluster failed to start in an earlier call"
		lan, err := testutil.StartLAN(2)
		if err != nil {
			b.Fatalf("lan: %v", err)
		}
		c := &cluster{lan: lan}
		benchHosts.c = c
		c.start(b)
		b.Logf("cluster up: %s", lan)
		for _, h := range []string{"h1", "h2"} {
			c.cli(b, "create", "bench/"+h, "--image", "nexus-mini", "--memory", "256m", "--host", h, "-l", label)
		}
		sbs := c.sandboxes(b)
		for _, h := range []string{"h1", "h2"} {
			if s := sbs["bench/"+h]; s.Host != h || s.State != "running" {
				b.Fatalf("bench/%s is %s on %q (%s), want running on %s", h, s.State, s.Host, s.Reason, h)
			}
		}
		// The caller is a client on h1, as the CLI there is: its connection is made from inside
		// h1's namespace, where the bus node's loopback port is.
		if err := lan.InHost(0, func() (err error) {
			benchHosts.nc, err = bus.Connect(context.Background(), bus.ConnectConfig{Home: c.hosts[0].Home, User: bus.UserCLI})
			return err
		}); err != nil {
			b.Fatalf("connect to h1's bus from its namespace: %v", err)
		}
		benchHosts.local, benchHosts.remote, benchHosts.failure = "bench/h1", "bench/h2", ""
	})
	if benchHosts.failure != "" {
		b.Fatal(benchHosts.failure)
	}
}

// closeBench removes what twoHosts made.
func closeBench() {
	if benchHosts.c == nil {
		return
	}
	if benchHosts.nc != nil {
		benchHosts.nc.Close()
	}
	benchHosts.c.stop()
	benchHosts.c.lan.Close()
}

// BenchmarkExecLocalRemote is the round trip of an exec of `true` through the gateway's API
// client on h1 (h1's gateway, the vmm of the sandbox's host, the stream session back) to a
// sandbox on h1 and to one on h2, each iteration one of each (they take turns at going first):
// what the extra hop between bus nodes over the LAN costs. ratio-p50 and ratio-p99 are remote
// over local.
func BenchmarkExecLocalRemote(b *testing.B) {
	twoHosts(b)
	client := api.NewClient(benchHosts.nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := func(name string) (time.Duration, error) {
		start := time.Now()
		exit, err := client.Run(ctx, api.ExecRequest{Name: name, Argv: []string{"true"}}, api.IO{})
		d := time.Since(start)
		if err == nil && (exit.Code != 0 || exit.Error != "") {
			err = fmt.Errorf("true in %s: exit %d %s", name, exit.Code, exit.Error)
		}
		return d, err
	}
	kinds := []struct {
		name, sandbox string
		lat           []time.Duration
	}{{name: "local", sandbox: benchHosts.local}, {name: "remote", sandbox: benchHosts.remote}}
	for i := range kinds {
		for range 3 { // the first sessions set up subscriptions and routes' interest
			if _, err := run(kinds[i].sandbox); err != nil {
				b.Fatalf("%s: %v", kinds[i].name, err)
			}
		}
	}
	b.ResetTimer()
	for n := range b.N {
		for j := range kinds {
			i := (j + n) % len(kinds) // each goes first every other iteration
			d, err := run(kinds[i].sandbox)
			if err != nil {
				b.Fatalf("%s: %v", kinds[i].name, err)
			}
			kinds[i].lat = append(kinds[i].lat, d)
		}
	}
	b.StopTimer()
	p := func(d []time.Duration, q float64) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[int(q*float64(len(s)-1))].Microseconds()) / 1000
	}
	local, remote := kinds[0].lat, kinds[1].lat
	b.ReportMetric(p(local, 0.5), "local-p50-ms")
	b.ReportMetric(p(local, 0.99), "local-p99-ms")
	b.ReportMetric(p(remote, 0.5), "remote-p50-ms")
	b.ReportMetric(p(remote, 0.99), "remote-p99-ms")
	b.ReportMetric(p(remote, 0.5)/p(local, 0.5), "ratio-p50")
	b.ReportMetric(p(remote, 0.99)/p(local, 0.99), "ratio-p99")
}
