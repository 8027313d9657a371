package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"golang.org/x/sync/errgroup"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/rs/zerolog"
)

// TestPSListsTwentyThousand: `nexus ps -a` over the bus lists every one of 20,000 records,
// in name order, each once (one reply of them all is larger than the bus's largest message,
// so the listing comes in pages); `ps` without -a leaves the stopped ones out, page after page.
func TestPSListsTwentyThousand(t *testing.T) {
	if testing.Short() {
		t.Skip("20,000 records")
	}
	const n = 20000
	tg := newTestGateway(t)
	// Written straight into the bucket, one record marshalled per shape: the registry follows
	// the bucket, and a test that walked each through Registry.Create took minutes under -race.
	kv, err := bus.KV(tg.ctx, tg.bus.Connect(t, bus.UserGateway), bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			sb := api.Sandbox{ID: fmt.Sprintf("sb-%05d", i), Name: fmt.Sprintf("many/sb-%05d", i), Image: "nexus-mini", Host: bus.LocalHost, Agent: "claude-code",
				MemoryMiB: 256, VCPUs: 1, State: api.StateCreated, Labels: map[string]string{"team": fmt.Sprint(i % 7), "purpose": "a label long enough to make a record of some size"},
				Egress: api.Egress{Mode: api.EgressCurated, Allow: []string{"api.example.com", "registry.npmjs.org", "pypi.org"}}}
			if i%200 == 199 { // one in 200 stopped
				sb.State = api.StateStopped
			}
			b, err := json.Marshal(sb)
			if err != nil {
				return err
			}
			_, err = kv.Put(tg.ctx, sb.Name, b)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	svc, err := bus.NewService(tg.cfg.Bus, bus.ServiceInfo{Name: "gateway", Version: "0.0.1", Host: bus.LocalHost}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := api.List.Serve(svc, tg.list); err != nil {
		t.Fatal(err)
	}
	cli := api.NewClient(tg.bus.Connect(t, bus.UserCLI))
	ctx := context.Background()
	list, err := cli.List(ctx, api.ListRequest{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n {
		t.Fatalf("ps -a listed %d of %d sandboxes", len(list), n)
	}
	for i, sb := range list {
		if want := fmt.Sprintf("many/sb-%05d", i); sb.Name != want {
			t.Fatalf("ps -a: sandbox %d is %s, want %s", i, sb.Name, want)
		}
	}
	running, err := cli.List(ctx, api.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(running) != n-n/200 {
		t.Fatalf("ps listed %d sandboxes, want the %d not stopped", len(running), n-n/200)
	}
	for i, sb := range running {
		if want := fmt.Sprintf("many/sb-%05d", i+i/199); sb.Name != want || sb.State != api.StateCreated {
			t.Fatalf("ps: sandbox %d is %s (%s), want %s (created)", i, sb.Name, sb.State, want)
		}
	}
}
