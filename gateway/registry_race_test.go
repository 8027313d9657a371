package gateway

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// twoGateways are the registries of two gateways on one bus, each over its own connection.
func twoGateways(t *testing.T) (*testutil.Bus, context.Context, [2]*Registry) {
	t.Helper()
	b := testutil.NewBus(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var regs [2]*Registry
	for i := range regs {
		r, err := NewRegistry(ctx, b.Connect(t, bus.UserGateway))
		if err != nil {
			t.Fatal(err)
		}
		regs[i] = r
	}
	return b, ctx, regs
}

// Two gateways racing updates on one record: the revision check lets exactly one write of a
// revision through and refuses the other with a conflict that says what to do; a loser that
// reads again and retries lands its change, so no update is lost.
func TestTwoGatewaysRaceOnOneRecord(t *testing.T) {
	_, ctx, gw := twoGateways(t)
	sb := &api.Sandbox{Name: "race/one", Image: "nexus-mini", Host: bus.LocalHost, Labels: map[string]string{"n": "0"}}
	if err := gw[0].Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	// Both read the same revision; the second write of it loses.
	a, err := gw[0].Get(ctx, sb.Name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := gw[1].Get(ctx, sb.Name)
	if err != nil {
		t.Fatal(err)
	}
	a.Labels["by"] = "a"
	if err := gw[0].Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	b.Labels["by"] = "b"
	err = gw[1].Update(ctx, b)
	if !errors.Is(err, errdefs.ErrConflict) || err.Error() != "sandbox race/one was changed by someone else; read it again and retry" {
		t.Fatalf("the losing write: %v; want the conflict", err)
	}
	if cur, _ := gw[1].Get(ctx, sb.Name); cur.Labels["by"] != "a" {
		t.Fatalf("the record after the race: %v; want the winner's change", cur.Labels)
	}

	// Many increments from both, each read-modify-write retried on a conflict: every one lands.
	const each = 25
	var wg sync.WaitGroup
	var conflicts sync.Map
	for g := range gw {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					for {
						cur, err := gw[g].Get(ctx, sb.Name)
						if err != nil {
							t.Error(err)
							return
						}
						n, _ := strconv.Atoi(cur.Labels["n"])
						cur.Labels["n"] = strconv.Itoa(n + 1)
						err = gw[g].Update(ctx, cur)
						if errors.Is(err, errdefs.ErrConflict) {
							conflicts.Store(g, true)
							continue
						}
						if err != nil {
							t.Error(err)
						}
						break
					}
				}
			}()
		}
	}
	wg.Wait()
	cur, err := gw[0].Get(ctx, sb.Name)
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(len(gw) * 2 * each); cur.Labels["n"] != want {
		t.Fatalf("after %s increments from two gateways the record says %s: updates were lost", want, cur.Labels["n"])
	}
	// Each gateway's listing (its watched cache) comes to the final record too.
	for i, r := range gw {
		testutil.WaitFor(t, 10*time.Second, func() error {
			list, err := r.List(ctx, nil)
			if err != nil {
				return err
			}
			if len(list) != 1 || list[0].Labels["n"] != cur.Labels["n"] || list[0].Revision != cur.Revision {
				return fmt.Errorf("gateway %d lists %+v, want revision %d", i, list, cur.Revision)
			}
			return nil
		})
	}
}

// The listing cache: records already there when a gateway starts are listed (the initial load),
// another gateway's creates, changes and removals show up, and this gateway's own writes are
// listed at once.
func TestRegistryCacheFollowsTheBucket(t *testing.T) {
	b, ctx, gw := twoGateways(t)
	before := &api.Sandbox{Name: "cache/before", Image: "nexus-mini", Host: bus.LocalHost}
	if err := gw[0].Create(ctx, before); err != nil {
		t.Fatal(err)
	}
	late, err := NewRegistry(ctx, b.Connect(t, bus.UserGateway))
	if err != nil {
		t.Fatal(err)
	}
	names := func(r *Registry) string {
		list, err := r.List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := ""
		for _, sb := range list {
			s += sb.Name + ":" + string(sb.State) + " "
		}
		return s
	}
	if got := names(late); got != "cache/before:created " {
		t.Fatalf("a gateway started after a record was made lists %q", got)
	}
	mine := &api.Sandbox{Name: "cache/mine", Image: "nexus-mini", Host: bus.LocalHost}
	if err := late.Create(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if err := late.Transition(ctx, mine, api.StateStarting, "", nil); err != nil {
		t.Fatal(err)
	}
	if got := names(late); got != "cache/before:created cache/mine:starting " {
		t.Fatalf("right after its own writes a gateway lists %q", got)
	}
	cur, err := gw[1].Get(ctx, before.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw[1].Transition(ctx, cur, api.StateStarting, "", nil); err != nil {
		t.Fatal(err)
	}
	if err := gw[1].Delete(ctx, mustGet(t, ctx, gw[1], mine.Name)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := names(late); got != "cache/before:starting " {
			return fmt.Errorf("after another gateway's change and removal this one lists %q", got)
		}
		return nil
	})
	// A name removed and made again is listed again.
	again := &api.Sandbox{Name: "cache/mine", Image: "nexus-mini", Host: bus.LocalHost}
	if err := gw[1].Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := names(late); got != "cache/before:starting cache/mine:created " {
			return fmt.Errorf("after the name was made again: %q", got)
		}
		return nil
	})
}

func mustGet(t *testing.T, ctx context.Context, r *Registry, name string) *api.Sandbox {
	t.Helper()
	sb, err := r.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// A bus restarted under a gateway: changes made while its connection was down are in its
// listings once it is back (the watch is loaded again whole after the reconnect).
func TestRegistryCacheResyncsAfterBusRestart(t *testing.T) {
	h := home.Dir(testutil.IsolateHome(t))
	port, err := testutil.BusPort()
	if err != nil {
		t.Fatal(err)
	}
	start := func() *bus.Server {
		t.Helper()
		srv, err := bus.StartServer(context.Background(), bus.ServerConfig{Home: h, Port: port, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	srv := start()
	defer func() { srv.Shutdown() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, err := bus.Connect(ctx, bus.ConnectConfig{Home: h, User: bus.UserGateway, URL: srv.URL(), Reconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	reg, err := NewRegistry(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Create(ctx, &api.Sandbox{Name: "resync/kept", Image: "nexus-mini", Host: bus.LocalHost}); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	srv = start()
	other, err := bus.Connect(ctx, bus.ConnectConfig{Home: h, User: bus.UserGateway, URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	writer, err := NewRegistry(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.Create(ctx, &api.Sandbox{Name: "resync/new", Image: "nexus-mini", Host: bus.LocalHost}); err != nil {
		t.Fatal(err)
	}
	// A watch asked for while the bus came back can wait out its request deadline (5 s) before it
	// is made again.
	testutil.WaitFor(t, 15*time.Second, func() error {
		list, err := reg.List(ctx, nil)
		if err != nil {
			return err
		}
		var names []string
		for _, sb := range list {
			names = append(names, sb.Name)
		}
		if fmt.Sprint(names) != "[resync/kept resync/new]" {
			return fmt.Errorf("after the bus restarted the gateway lists %v", names)
		}
		if !reg.cache.waitLive(ctx, 0) {
			return errors.New("the cache is not loaded again")
		}
		return nil
	})
}
