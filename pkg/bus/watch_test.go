package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

type watchReq struct{ Name string }
type watchResp struct{ By string }

var (
	watchWrite = bus.Endpoint[watchReq, watchResp]{Scope: bus.GatewayAPI, Verb: "watch.write"}
	watchRead  = bus.Endpoint[watchReq, watchResp]{Scope: bus.GatewayAPI, Verb: "watch.read", Read: true}
)

// serveGateway starts one instance of a gateway serving both endpoints, whose handlers hang
// until the caller gives up (hang) or answer with by. Its stop is what a kill does to it: it
// leaves the bus.
func serveGateway(t *testing.T, b *testutil.Bus, by string, hang bool) (stop func()) {
	t.Helper()
	nc := b.Connect(t, bus.UserGateway)
	svc, err := bus.NewService(nc, bus.ServiceInfo{Name: "gateway", Version: "0.0.1", Host: bus.LocalHost}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, r watchReq) (watchResp, error) {
		if hang {
			<-ctx.Done()
			return watchResp{}, ctx.Err()
		}
		return watchResp{By: by}, nil
	}
	if err := watchWrite.Serve(svc, handler); err != nil {
		t.Fatal(err)
	}
	if err := watchRead.Serve(svc, handler); err != nil {
		t.Fatal(err)
	}
	return nc.Close
}

// cliConn connects as the CLI does: each call watches the service that took it.
func cliConn(t *testing.T, b *testutil.Bus) *nats.Conn {
	t.Helper()
	nc, err := bus.Connect(context.Background(), bus.ConnectConfig{Home: b.Home, User: bus.UserCLI, URL: b.URL, Watch: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// A CLI call whose gateway dies while it waits ends within seconds with one sentence saying
// the gateway is not running and how to start it, instead of waiting out its deadline.
func TestCallEndsWhenItsGatewayDies(t *testing.T) {
	b := testutil.NewBus(t)
	stop := serveGateway(t, b, "first", true)
	nc := cliConn(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	time.AfterFunc(500*time.Millisecond, stop)
	began := time.Now()
	_, err := watchWrite.Call(ctx, nc, "", watchReq{})
	const want = "the gateway service is not running: it stopped while it handled this request (nexus.gateway.watch.write); start it with `nexus up` (or `nexus serve gateway`)"
	if !errors.Is(err, errdefs.ErrUnavailable) || err.Error() != want {
		t.Fatalf("call whose gateway died: %v; want %q", err, want)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("the call noticed its gateway was gone only after %v", took)
	}
}

// When the gateway restarted (a new instance) while a call waited: a call that changes
// something says its answer is lost and what to do; a read is asked again and answered.
func TestCallWhoseGatewayRestarted(t *testing.T) {
	b := testutil.NewBus(t)
	nc := cliConn(t, b)
	for _, read := range []bool{false, true} {
		stop := serveGateway(t, b, "first", true)
		restarted := make(chan func(), 1)
		time.AfterFunc(500*time.Millisecond, func() {
			stop()
			restarted <- serveGateway(t, b, "second", false)
		})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if read {
			got, err := watchRead.Call(ctx, nc, "", watchReq{})
			if err != nil || got.By != "second" {
				t.Errorf("read whose gateway restarted: %+v, %v; want it answered by the new gateway", got, err)
			}
		} else {
			_, err := watchWrite.Call(ctx, nc, "", watchReq{})
			const want = "the gateway service restarted while it handled this request (nexus.gateway.watch.write), so its answer is lost: check the outcome (nexus ps) and run the command again"
			if !errors.Is(err, errdefs.ErrUnavailable) || err.Error() != want {
				t.Errorf("write whose gateway restarted: %v; want %q", err, want)
			}
		}
		cancel()
		(<-restarted)()
	}
}

// A call whose bus goes away for good says so in one sentence (not "nats: connection closed").
func TestCallWhoseBusIsGone(t *testing.T) {
	b := testutil.NewBus(t)
	serveGateway(t, b, "first", true)
	nc := cliConn(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	time.AfterFunc(300*time.Millisecond, b.Server.Shutdown)
	_, err := watchWrite.Call(ctx, nc, "", watchReq{})
	const want = "lost the connection to the bus while waiting for the gateway service (nexus.gateway.watch.write): nexus is not running; start it with `nexus up`"
	if !errors.Is(err, errdefs.ErrUnavailable) || err.Error() != want {
		t.Fatalf("call whose bus is gone: %v; want %q", err, want)
	}
}
