package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
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

// TestPSFollowsChanges: ps lists by name, leaves stopped ones out without -a, selects by label
// and pages by name; a record this gateway changed or removed, and one another gateway wrote
// straight into the bucket, show as they are now in the next ps, at their current revision.
func TestPSFollowsChanges(t *testing.T) {
	tg := newTestGateway(t)
	svc, err := bus.NewService(tg.cfg.Bus, bus.ServiceInfo{Name: "gateway", Version: "0.0.1", Host: bus.LocalHost}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := api.List.Serve(svc, tg.list); err != nil {
		t.Fatal(err)
	}
	cli := api.NewClient(tg.bus.Connect(t, bus.UserCLI))
	ctx := context.Background()
	a := tg.add(t, &api.Sandbox{Name: "p/a", Labels: map[string]string{"team": "x"}}, api.StateCreated)
	b := tg.add(t, &api.Sandbox{Name: "p/b", Labels: map[string]string{"team": "y"}}, api.StateStopped)
	c := tg.add(t, &api.Sandbox{Name: "p/c", Labels: map[string]string{"team": "x"}}, api.StateRunning)
	tg.add(t, &api.Sandbox{Name: "p/0"}, api.StateCreated)
	ps := func(r api.ListRequest) string {
		t.Helper()
		list, err := cli.List(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		// A record listed at another revision than the bucket's (or one gone from it) shows as
		// stale, so that a comparison fails on it and a wait for the watch looks again.
		for _, sb := range list {
			cur, err := tg.reg.Get(ctx, sb.Name)
			switch {
			case errors.Is(err, errdefs.ErrNotFound):
				out = append(out, fmt.Sprintf("%s:stale(removed from the bucket)", sb.Name))
				continue
			case err != nil:
				t.Fatal(err)
			case cur.Revision != sb.Revision:
				out = append(out, fmt.Sprintf("%s:stale(revision %d, the bucket's %d)", sb.Name, sb.Revision, cur.Revision))
				continue
			}
			out = append(out, fmt.Sprintf("%s:%s", sb.Name, sb.State))
		}
		return strings.Join(out, " ")
	}
	check := func(what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %s, want %s", what, got, want)
		}
	}
	check("ps -a", ps(api.ListRequest{All: true}), "p/0:created p/a:created p/b:stopped p/c:running")
	check("ps", ps(api.ListRequest{}), "p/0:created p/a:created p/c:running")
	check("ps -l team=x", ps(api.ListRequest{Selector: []string{"team=x"}}), "p/a:created p/c:running")
	check("ps -a -l team!=x", ps(api.ListRequest{All: true, Selector: []string{"team!=x"}}), "p/0:created p/b:stopped")
	var paged []string
	for after := ""; ; {
		page, err := api.List.Call(ctx, tg.bus.Connect(t, bus.UserCLI), "", api.ListRequest{All: true, After: after, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) != 1 {
			t.Fatalf("a page of limit 1 has %d sandboxes", len(page))
		}
		after = page[0].Name
		paged = append(paged, after)
	}
	check("ps -a one by one", strings.Join(paged, " "), "p/0 p/a p/b p/c")
	// ps --json prints the pages as the gateway wrote them, joined: what decoding and encoding
	// them again would print, for any page size.
	for _, r := range []api.ListRequest{{All: true}, {All: true, Limit: 1}, {Limit: 2}, {All: true, Limit: 3}, {Selector: []string{"team=nobody"}}} {
		list, err := cli.List(ctx, api.ListRequest{All: r.All, Selector: r.Selector})
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(list)
		got, err := cli.ListJSON(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("ListJSON(%+v):\n%s\nwant\n%s", r, got, want)
		}
	}

	// This gateway's own writes.
	a.Labels = map[string]string{"team": "y"}
	if err := tg.reg.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := tg.reg.Transition(ctx, c, api.StateStopping, "", nil); err != nil {
		t.Fatal(err)
	}
	check("ps -l team=x after changes", ps(api.ListRequest{Selector: []string{"team=x"}}), "p/c:stopping")
	if err := tg.reg.Delete(ctx, tg.get(t, c)); err != nil {
		t.Fatal(err)
	}
	check("ps -a after rm p/c", ps(api.ListRequest{All: true}), "p/0:created p/a:created p/b:stopped")

	// Another gateway's: they reach this one by the watch of the bucket.
	kv, err := bus.KV(ctx, tg.bus.Connect(t, bus.UserGateway), bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	put := func(sb *api.Sandbox) {
		data, _ := json.Marshal(sb)
		if _, err := kv.Put(ctx, sb.Name, data); err != nil {
			t.Fatal(err)
		}
	}
	b = tg.get(t, b)
	b.State = api.StateFailed
	put(b)
	put(&api.Sandbox{Name: "p/e", ID: "sb-e", State: api.StateCreated, Host: bus.LocalHost, Labels: map[string]string{"team": "x"}})
	if err := kv.Purge(ctx, "p/0"); err != nil {
		t.Fatal(err)
	}
	want := "p/a:created p/b:failed p/e:created"
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := ps(api.ListRequest{All: true}); got != want {
			return fmt.Errorf("ps -a lists %s, want %s", got, want)
		}
		return nil
	})
	check("ps -l team=x after the other gateway's writes", ps(api.ListRequest{Selector: []string{"team=x"}}), "p/e:created")
}

// TestPSListsLargeRecords: 3000 records of 4 KiB (a project config's allowlist) are 12 MiB, more
// than one bus message: ps pages them by bytes as well and lists every one, in order.
func TestPSListsLargeRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("3000 large records")
	}
	const n = 3000
	tg := newTestGateway(t)
	kv, err := bus.KV(tg.ctx, tg.bus.Connect(t, bus.UserGateway), bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	allow := make([]string, 160)
	for i := range allow {
		allow[i] = fmt.Sprintf("host-%03d.registry.example.com", i)
	}
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			sb := api.Sandbox{ID: fmt.Sprintf("sb-%05d", i), Name: fmt.Sprintf("big/sb-%05d", i), Image: "nexus-mini", Host: bus.LocalHost,
				State: api.StateCreated, Egress: api.Egress{Mode: api.EgressCurated, Allow: allow}}
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
	nc := tg.bus.Connect(t, bus.UserCLI)
	cli := api.NewClient(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	raw, err := api.List.CallJSON(ctx, nc, "", api.ListRequest{All: true, Limit: api.ListPage, MaxBytes: api.ListPageBytes})
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > api.ListPageBytes {
		t.Errorf("a page is %d bytes, more than %d", len(raw), api.ListPageBytes)
	}
	list, err := cli.List(ctx, api.ListRequest{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n {
		t.Fatalf("ps -a listed %d of %d sandboxes", len(list), n)
	}
	for i, sb := range list {
		if want := fmt.Sprintf("big/sb-%05d", i); sb.Name != want || len(sb.Egress.Allow) != len(allow) {
			t.Fatalf("ps -a: sandbox %d is %s with %d hosts, want %s with %d", i, sb.Name, len(sb.Egress.Allow), want, len(allow))
		}
	}
	asJSON, err := cli.ListJSON(ctx, api.ListRequest{All: true})
	if err != nil {
		t.Fatal(err)
	}
	var decoded []api.SandboxView
	if err := json.Unmarshal(asJSON, &decoded); err != nil || len(decoded) != n {
		t.Fatalf("ps -a --json: %d sandboxes (%v)", len(decoded), err)
	}
}
