package bus_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/pkg/stream"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func startNode(t *testing.T, h home.Dir) *bus.Server {
	t.Helper()
	s, err := bus.StartServer(context.Background(), bus.ServerConfig{Home: h, Log: zerolog.Nop()})
	if err != nil {
		t.Fatalf("start node %s: %v", h, err)
	}
	return s
}

// TestClusterOfThree: a home that ran the single-host bus becomes the first node of a cluster
// and keeps its records (migrated into the cluster's store); two hosts join with a token; the
// buckets and streams are raised to R3; a record written on one node is read on another; the
// token is refused once revoked; a
// worker host's services serve only their own host's subjects and have no gateway user; and
// no node's client port answers without TLS or without credentials.
func TestClusterOfThree(t *testing.T) {
	if testing.Short() {
		t.Skip("three bus nodes")
	}
	testutil.IsolateHome(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ha, hb, hc := home.Dir(t.TempDir()), home.Dir(t.TempDir()), home.Dir(t.TempDir())

	// A single-host home with a record in its R1 registry.
	single, err := bus.StartServer(ctx, bus.ServerConfig{Home: ha, Port: -1, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := bus.Connect(ctx, bus.ConnectConfig{Home: ha, User: bus.UserGateway, URL: single.URL()})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := bus.KV(ctx, nc, bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "sb-old", []byte(`{"name":"old"}`)); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if err := single.WaitStore(ctx); err != nil {
		t.Fatalf("WaitStore on a single-host bus: %v", err)
	}
	single.Shutdown()

	// Without a cluster, nothing listens beyond loopback.
	_, err = bus.StartServer(ctx, bus.ServerConfig{Home: hb, Host: "0.0.0.0", Port: -1, Log: zerolog.Nop()})
	if !errors.Is(err, errdefs.ErrRefused) || !strings.Contains(err.Error(), "requires TLS") {
		t.Fatalf("a single-host bus on 0.0.0.0: %v, want refused for want of TLS", err)
	}

	if _, err := bus.Init(bus.InitConfig{Home: ha, Name: "t", Host: "a", Advertise: "127.0.0.1", Listen: "127.0.0.1",
		ClientPort: freePort(t), RoutePort: freePort(t)}); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, ha)
	defer a.Shutdown()
	// Alone, the first node has no quorum: its store does not serve, so `nexus up` waits
	// before it starts the services (which would fail to open their buckets).
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	if err := a.WaitStore(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitStore on a lone cluster node: %v, want it still waiting at its deadline", err)
	}
	wcancel()
	clA, _, _ := bus.LoadCluster(ha)
	_, token, err := bus.CreateToken(ha, []string{clA.ClientURL()}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	join := func(h home.Dir, host string, control bool) error {
		_, err := bus.Join(ctx, bus.JoinConfig{Home: h, Token: token, Host: host, Advertise: "127.0.0.1", Listen: "127.0.0.1",
			ClientPort: freePort(t), RoutePort: freePort(t), Control: control})
		return err
	}
	// The bus picks up a new token within a second or so.
	var joinErr error
	waitUntil(t, time.Minute, "the first join", func() bool {
		joinErr = join(hb, "b", false)
		if joinErr != nil {
			t.Logf("join: %v", joinErr)
		}
		return joinErr == nil
	})
	if err := join(home.Dir(t.TempDir()), "b", false); err == nil || !strings.Contains(err.Error(), "is in the cluster already") {
		t.Fatalf("a second host b joined: %v", err)
	}
	if err := join(hc, "c", true); err != nil {
		t.Fatal(err)
	}
	b := startNode(t, hb)
	defer b.Shutdown()
	c := startNode(t, hc)
	defer c.Shutdown()
	for _, n := range []*bus.Server{a, c} {
		if err := n.WaitStore(ctx); err != nil {
			t.Fatalf("WaitStore with three nodes: %v", err)
		}
	}

	admin, err := bus.Connect(ctx, bus.ConnectConfig{Home: ha, User: bus.UserAdmin, URL: a.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, st := range []string{bus.StreamAudit, bus.StreamEvents, "KV_" + bus.KVSandboxes, "KV_" + bus.KVLeases} {
		waitUntil(t, 2*time.Minute, st+" at R3", func() bool {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			defer rcancel()
			n, err := bus.Replicas(rctx, admin, st)
			if err != nil || n != bus.ClusterReplicas {
				t.Logf("%s: %d replicas (%v)", st, n, err)
			}
			return err == nil && n == bus.ClusterReplicas
		})
	}
	// The single-host record survived, and is read on another node.
	gwC, err := bus.Connect(ctx, bus.ConnectConfig{Home: hc, User: bus.UserGateway, URL: c.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer gwC.Close()
	kvC, err := bus.KV(ctx, gwC, bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvC.Put(ctx, "sb-new", []byte(`{"name":"new"}`)); err != nil {
		t.Fatal(err)
	}
	gwA0, err := bus.Connect(ctx, bus.ConnectConfig{Home: ha, User: bus.UserGateway, URL: a.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer gwA0.Close()
	kvA, err := bus.KV(ctx, gwA0, bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kvA.Get(ctx, "sb-new"); err != nil || string(e.Value()) != `{"name":"new"}` {
		t.Fatalf("a record written on node c, read on node a: %v", err)
	}
	if e, err := kvC.Get(ctx, "sb-old"); err != nil || string(e.Value()) != `{"name":"old"}` {
		t.Fatalf("the single-host record, migrated on node a, read on node c: %v", err)
	}
	if _, err := os.Stat(bus.SingleHostStore(ha)); err != nil {
		t.Fatalf("the single-host store was not kept aside: %v", err)
	}

	// A request crosses the cluster: a's gateway reaches c's vmm.
	vmmC, err := bus.Connect(ctx, bus.ConnectConfig{Home: hc, User: bus.UserVMM, URL: c.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer vmmC.Close()
	if _, err := vmmC.Subscribe(bus.VMMAPI.Subject("c", "ping"), func(m *nats.Msg) { m.Respond([]byte("pong")) }); err != nil {
		t.Fatal(err)
	}
	vmmC.Flush()
	gwA, err := bus.Connect(ctx, bus.ConnectConfig{Home: ha, User: bus.UserGateway, URL: a.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer gwA.Close()
	waitUntil(t, 20*time.Second, "a's gateway reaching c's vmm", func() bool {
		m, err := gwA.Request(bus.VMMAPI.Subject("c", "ping"), nil, time.Second)
		return err == nil && string(m.Data) == "pong"
	})

	// Host b's identities: none can serve or call host a's vmm, and b has no gateway user.
	// A peer of a's stream sessions answers what b's identities may send them.
	if _, err := admin.Subscribe("nexus.stream.a.>", func(m *nats.Msg) { m.Respond([]byte(`{}`)) }); err != nil {
		t.Fatal(err)
	}
	admin.Flush()
	for _, u := range bus.HostUsers(hb) {
		if u == bus.UserBus {
			continue
		}
		creds, err := bus.LoadCreds(hb.BusCreds(), u)
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 64)
		cl, err := nats.Connect(b.URL(), nats.UserInfo(creds.User, creds.Password), nats.CustomInboxPrefix(bus.InboxPrefix(u)),
			nats.Secure(mustTLS(t, hb)), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
		if err != nil {
			t.Fatalf("%s of b: %v", u, err)
		}
		for _, pc := range []permCase{
			{what: "serve a's vmm", subject: bus.VMMAPI.Subject("a", ">"), sub: true},
			{what: "serve a's netstack", subject: bus.NetstackAPI.Subject("a", ">"), sub: true},
			{what: "call a's vmm", subject: bus.VMMAPI.Subject("a", "sandbox.create"), body: `{}`},
			{what: "serve a's stream sessions", subject: "nexus.stream.a.*.in", sub: true},
			{what: "send output on a's stream sessions", subject: "nexus.stream.a.sid1.out", body: `{}`},
			{what: "subscribe to every stream session", subject: "nexus.stream.>", sub: true},
			// The CLI (and the remote API) is every host's client: it follows and feeds a session wherever it is served.
			{what: "follow a's session output", subject: "nexus.stream.a.*.out", sub: true, allowed: []string{bus.UserCLI, bus.UserAPI}},
			{what: "send input to a's sessions", subject: "nexus.stream.a.sid1.in", body: `{}`, allowed: []string{bus.UserCLI, bus.UserAPI}},
		} {
			got, err := try(cl, pc, errs)
			if want := slices.Contains(pc.allowed, u); err != nil || got != want {
				t.Errorf("%s of host b: %s: allowed=%v, want %v (%v)", u, pc.what, got, want, err)
			}
		}
		cl.Close()
	}
	for _, u := range bus.ControlUsers {
		creds, _ := bus.LoadCreds(hb.BusCreds(), u)
		if _, err := nats.Connect(b.URL(), nats.UserInfo(creds.User, creds.Password), nats.Secure(mustTLS(t, hb)), nats.MaxReconnects(0)); err == nil {
			t.Errorf("worker host b's node accepts the control user %s", u)
		}
	}
	// Host b's vmm serves its own host.
	vmmB, err := bus.Connect(ctx, bus.ConnectConfig{Home: hb, User: bus.UserVMM, URL: b.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer vmmB.Close()
	errs := make(chan error, 8)
	vmmB.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
	if got, err := try(vmmB, permCase{subject: bus.VMMAPI.Subject("b", ">"), sub: true}, errs); err != nil || !got {
		t.Errorf("b's vmm may not serve its own host (%v)", err)
	}

	// An exec-style session across hosts: b's CLI is the client of a session c's vmm serves.
	cliB, err := bus.Connect(ctx, bus.ConnectConfig{Home: hb, User: bus.UserCLI, URL: b.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer cliB.Close()
	sid := stream.NewID()
	client, err := stream.Client(cliB, sid)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := stream.Server(vmmC, "c", sid)
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if err := client.Write(stream.KindStdin, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if m, err := server.Recv(); err != nil || m.Kind != stream.KindStdin || string(m.Data) != "ping" {
		t.Fatalf("c's vmm got %s %q (%v) from b's CLI; want stdin \"ping\"", m.Kind, m.Data, err)
	}
	if err := server.Write(stream.KindStdout, []byte("pong")); err != nil {
		t.Fatal(err)
	}
	if m, err := client.Recv(); err != nil || m.Kind != stream.KindStdout || string(m.Data) != "pong" {
		t.Fatalf("b's CLI got %s %q (%v) from c's vmm; want stdout \"pong\"", m.Kind, m.Data, err)
	}

	// Nothing answers without TLS or without credentials.
	clB, _, _ := bus.LoadCluster(hb)
	if _, err := nats.Connect("nats://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(clB.ClientPort)), nats.MaxReconnects(0), nats.Timeout(2*time.Second)); err == nil {
		t.Error("node b answers a client without TLS")
	}
	if _, err := nats.Connect(b.URL(), nats.Secure(mustTLS(t, hb)), nats.MaxReconnects(0), nats.Timeout(2*time.Second)); err == nil {
		t.Error("node b answers a client without credentials")
	}

	// A revoked token admits nobody.
	tokens, _ := bus.Tokens(ha)
	if err := bus.RevokeToken(ha, tokens[0].ID); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, "the revoked token refused", func() bool {
		err := join(home.Dir(t.TempDir()), "d", false)
		return errors.Is(err, errdefs.ErrRefused)
	})
}

func mustTLS(t *testing.T, h home.Dir) *tls.Config {
	t.Helper()
	c, err := bus.ClientTLS(h)
	if err != nil || c == nil {
		t.Fatalf("client TLS of %s: %v", h, err)
	}
	return c
}

// waitUntil waits up to d for cond, failing t with what it waited for.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, d, func() error {
		if cond() {
			return nil
		}
		return errors.New("still waiting for " + what)
	})
}
