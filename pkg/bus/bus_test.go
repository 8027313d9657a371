package bus_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

func TestCredentialsArePrivate(t *testing.T) {
	b := testutil.NewBus(t)
	for _, u := range bus.Users {
		fi, err := os.Stat(filepath.Join(b.Home.BusCreds(), u+".json"))
		if err != nil {
			t.Fatalf("creds of %s: %v", u, err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("creds of %s have mode %v, want 0600", u, fi.Mode().Perm())
		}
	}
}

func TestUnauthenticatedClientIsRejected(t *testing.T) {
	b := testutil.NewBus(t)
	if nc, err := nats.Connect(b.URL, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without credentials was accepted")
	}
	if nc, err := nats.Connect(b.URL, nats.UserInfo(bus.UserGateway, "wrong"), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client with a wrong password was accepted")
	}
}

func TestPublishOutsidePermissionsIsRefused(t *testing.T) {
	b := testutil.NewBus(t)
	errs := make(chan error, 4)
	creds, err := bus.LoadCreds(b.Home.BusCreds(), bus.UserNetstack)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.URL, nats.UserInfo(creds.User, creds.Password), nats.CustomInboxPrefix(bus.InboxPrefix(bus.UserNetstack)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Only mitm may ask credbroker to resolve a placeholder.
	if err := nc.Publish(credapi.Resolve.Subject(""), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("got %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("publishing to nexus.cred.resolve as netstack was not refused")
	}
	// And a request through the typed helper says so in one sentence.
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = credapi.NewClient(b.Connect(t, bus.UserNetstack)).Resolve(short, credapi.ResolveRequest{})
	if err == nil || !errors.Is(err, errdefs.ErrRefused) && !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("request outside permissions: got %v", err)
	}
	// mitm may.
	if err := b.Connect(t, bus.UserMITM).Publish(credapi.Resolve.Subject(""), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
}

func TestEnvelopeRoundTripAndErrorClasses(t *testing.T) {
	b := testutil.NewBus(t)
	svc, err := bus.NewService(b.Connect(t, bus.UserVMM), bus.ServiceInfo{Name: "vmm", Version: "0.0.1", Host: "local"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	type req struct{ Name string }
	type resp struct{ Greeting string }
	hello := bus.Endpoint[req, resp]{Scope: bus.VMMAPI, Verb: "hello"}
	subject := hello.Subject(bus.LocalHost)
	err = hello.Serve(svc, func(ctx context.Context, r req) (resp, error) {
		switch r.Name {
		case "":
			return resp{}, errdefs.Invalid("name is required")
		case "slow":
			<-ctx.Done()
			return resp{}, ctx.Err()
		case "boom":
			panic("boom")
		}
		if _, ok := ctx.Deadline(); !ok {
			t.Error("handler context has no deadline")
		}
		return resp{Greeting: "hi " + r.Name}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gw := b.Connect(t, bus.UserGateway)
	got, err := bus.Request[resp](context.Background(), gw, subject, req{Name: "ada"})
	if err != nil || got.Greeting != "hi ada" {
		t.Fatalf("got %+v, %v", got, err)
	}
	_, err = bus.Request[resp](context.Background(), gw, subject, req{})
	if !errors.Is(err, errdefs.ErrInvalid) || err.Error() != "name is required" {
		t.Fatalf("invalid: got %v", err)
	}
	_, err = bus.Request[resp](context.Background(), gw, subject, req{Name: "boom"})
	if !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("panic: got %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = bus.Request[resp](ctx, gw, subject, req{Name: "slow"})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("deadline: got %v", err)
	}
	_, err = bus.Request[resp](context.Background(), gw, hello.Subject("nohost"), req{Name: "x"})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("no responder: got %v", err)
	}
}

func TestSecondBusForSameHomeRefused(t *testing.T) {
	b := testutil.NewBus(t)
	_, err := bus.StartServer(context.Background(), bus.ServerConfig{Home: b.Home, Port: -1})
	if !errors.Is(err, bus.ErrAlreadyRunning) {
		t.Fatalf("got %v, want already running", err)
	}
}

func TestJetStreamSurvivesRestart(t *testing.T) {
	dir := testutil.IsolateHome(t)
	b, err := testutil.StartBus(dir)
	if err != nil {
		t.Fatal(err)
	}
	nc := b.Connect(t, bus.UserGateway)
	kv, err := bus.KV(context.Background(), nc, bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), "default/keep", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	b.Server.Shutdown()

	b2, err := testutil.StartBus(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Server.Shutdown()
	kv2, err := bus.KV(context.Background(), b2.Connect(t, bus.UserGateway), bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv2.Get(context.Background(), "default/keep")
	if err != nil || string(e.Value()) != `{"x":1}` {
		t.Fatalf("after restart: %v %v", e, err)
	}
	// Services may not delete streams.
	js, _ := jetstream.New(b2.Connect(t, bus.UserVMM))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, bus.StreamAudit); err == nil {
		t.Fatal("vmm deleted the audit stream")
	}
}
