package credbroker

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

// startBroker runs a credbroker of its own home (host is its name) on tb until the returned
// stop is called or the test ends.
func startBroker(t *testing.T, tb *testutil.Bus, host string) (stop func()) {
	t.Helper()
	h := home.Dir(filepath.Join(t.TempDir(), host))
	svc, err := New(Config{Bus: tb.Connect(t, bus.UserCredbroker), Home: h, Host: host, Log: zerolog.Nop(), Version: "0.0.1",
		ClaudeCredentials: filepath.Join(string(h), "no-claude")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := svc.Run(ctx); err != nil {
			t.Errorf("credbroker %s: %v", host, err)
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// servingHosts are the hosts of the credbroker instances on the bus that have endpoints.
func servingHosts(t *testing.T, tb *testutil.Bus) []string {
	t.Helper()
	nc := tb.Connect(t, bus.UserGateway)
	var hosts []string
	infos, err := bus.Discover(context.Background(), nc, 300*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == bus.ServiceName("credbroker") && len(in.Endpoints) > 0 {
			hosts = append(hosts, in.Metadata[bus.MetaHost])
		}
	}
	return hosts
}

// TestOneCredbrokerServes: a second credbroker on the bus (a second control host of a cluster)
// stands by instead of answering half the requests from a store of its own, and takes over
// when the first is gone; two that start together settle on one.
func TestOneCredbrokerServes(t *testing.T) {
	bus.SoleEvery = 200 * time.Millisecond
	tb := testutil.NewBus(t)
	cli := credapi.NewClient(tb.Connect(t, bus.UserGateway))
	ctx := context.Background()

	stopA := startBroker(t, tb, "a")
	testutil.WaitFor(t, 10*time.Second, func() error { return cli.SecretSet(ctx, credapi.SecretSetRequest{Name: "GH_TOKEN", Value: "v-a"}) })
	startBroker(t, tb, "b")
	testutil.WaitFor(t, 10*time.Second, func() error {
		if n := len(instancesOf(t, tb)); n != 2 {
			return fmt.Errorf("%d credbroker instances registered, want 2", n)
		}
		return nil
	})
	// Every request goes to a's store: with b answering some, a list would come back empty.
	for i := range 40 {
		l, err := cli.SecretList(ctx)
		if err != nil || len(l.Secrets) != 1 || l.Secrets[0].Name != "GH_TOKEN" {
			t.Fatalf("list %d with a standby broker: %+v %v", i, l, err)
		}
	}
	if h := servingHosts(t, tb); len(h) != 1 || h[0] != "a" {
		t.Fatalf("serving credbrokers %v, want [a]", h)
	}

	// a goes away: b serves, from its own (empty) store.
	stopA()
	testutil.WaitFor(t, 10*time.Second, func() error {
		l, err := cli.SecretList(ctx)
		if err != nil {
			return err
		}
		if len(l.Secrets) != 0 {
			return fmt.Errorf("still a's store: %+v", l)
		}
		return nil
	})
	if h := servingHosts(t, tb); len(h) != 1 || h[0] != "b" {
		t.Fatalf("serving credbrokers %v, want [b]", h)
	}
}

func TestTwoCredbrokersStartingTogetherSettleOnOne(t *testing.T) {
	bus.SoleEvery = 200 * time.Millisecond
	tb := testutil.NewBus(t)
	startBroker(t, tb, "a")
	startBroker(t, tb, "b")
	testutil.WaitFor(t, 10*time.Second, func() error {
		if h := servingHosts(t, tb); len(h) != 1 {
			return fmt.Errorf("serving credbrokers %v, want one", h)
		}
		return nil
	})
	// And it stays one.
	for range 5 {
		time.Sleep(bus.SoleEvery)
		if h := servingHosts(t, tb); len(h) != 1 {
			t.Fatalf("serving credbrokers %v, want one", h)
		}
	}
}

func instancesOf(t *testing.T, tb *testutil.Bus) []micro.Info {
	t.Helper()
	infos, err := bus.Discover(context.Background(), tb.Connect(t, bus.UserGateway), 300*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []micro.Info
	for _, in := range infos {
		if in.Name == bus.ServiceName("credbroker") {
			out = append(out, in)
		}
	}
	return out
}
