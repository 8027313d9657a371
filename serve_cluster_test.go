package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/gateway/cli"
	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

func freePort(t *testing.T) int {
	t.Helper()
	port, err := testutil.BusPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestServeWaitsForTheClusterStore: `nexus serve <service>` on a cluster node whose peers are
// not up yet waits for the store as `nexus up` does, saying so, for at most --wait-store; once a
// second node is up it starts.
func TestServeWaitsForTheClusterStore(t *testing.T) {
	if testing.Short() {
		t.Skip("two bus nodes")
	}
	ha := home.Dir(testutil.IsolateHome(t))
	hb := home.Dir(t.TempDir())
	if _, err := bus.Init(bus.InitConfig{Home: ha, Name: "t", Host: "a", Advertise: "127.0.0.1", Listen: "127.0.0.1",
		ClientPort: freePort(t), RoutePort: freePort(t)}); err != nil {
		t.Fatal(err)
	}
	a, err := bus.StartServer(context.Background(), bus.ServerConfig{Home: ha, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()

	// Alone, node a has no quorum: the service waits, bounded, and says why it gave up.
	r := root()
	var stderr bytes.Buffer
	r.SetErr(&stderr)
	r.SetArgs([]string{"serve", "portfwd", "--wait-store", "2s", "--log-level", "error"})
	if code := cli.Execute(r); code == 0 || !strings.Contains(stderr.String(), "the store did not serve within --wait-store 2s") {
		t.Fatalf("nexus serve portfwd on a lone cluster node: exit %d, %q", code, stderr.String())
	}

	// The same wait, left running, ends once a second node makes a quorum.
	nc, err := bus.Connect(context.Background(), bus.ConnectConfig{Home: ha, User: bus.UserGateway, URL: a.URL(), Reconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var log testutil.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- waitClusterStore(context.Background(), ha, nc, bus.UserGateway, 3*time.Minute, zerolog.New(&log))
	}()
	testutil.WaitFor(t, time.Minute, func() error {
		if !strings.Contains(log.String(), "cluster: waiting for a quorum of the cluster's bus nodes") {
			return fmt.Errorf("no progress line yet: %q", log.String())
		}
		return nil
	})
	clA, _, _ := bus.LoadCluster(ha)
	_, token, err := bus.CreateToken(ha, []string{clA.ClientURL()}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, func() error { // the bus picks a new token up within a second or so
		_, err := bus.Join(context.Background(), bus.JoinConfig{Home: hb, Token: token, Host: "b", Advertise: "127.0.0.1", Listen: "127.0.0.1",
			ClientPort: freePort(t), RoutePort: freePort(t)})
		return err
	})
	b, err := bus.StartServer(context.Background(), bus.ServerConfig{Home: hb, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the wait with two nodes: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the wait did not end with two nodes up")
	}
	if !strings.Contains(log.String(), "cluster: the store serves") {
		t.Errorf("no line saying the wait ended: %q", log.String())
	}
}
