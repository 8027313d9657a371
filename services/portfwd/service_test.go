package portfwd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/agentproto"
	gwapi "github.com/IniZio/nexus/pkg/api/gateway"
	api "github.com/IniZio/nexus/pkg/api/portfwd"
	"github.com/IniZio/nexus/pkg/bus"
)

// stack is a bus, a running portfwd service, and connections as the vmm (listener sets) and
// the gateway (lifecycle events, the list API).
type stack struct {
	t       testing.TB
	bus     *testutil.Bus
	vmm     *nats.Conn
	gw      *nats.Conn
	cfg     Config
	stopSvc func()
}

func newStack(t testing.TB, mod func(*Config)) *stack {
	t.Helper()
	b := testutil.NewBus(t)
	st := &stack{t: t, bus: b, vmm: b.Connect(t, bus.UserVMM), gw: b.Connect(t, bus.UserGateway)}
	st.cfg = Config{Home: b.Home, Log: testLog(t), RestoreGrace: 3 * time.Second}
	if mod != nil {
		mod(&st.cfg)
	}
	st.start()
	t.Cleanup(func() { st.stopSvc() })
	return st
}

// start runs a fresh portfwd service (on its own connection) and waits until it answers.
func (st *stack) start() {
	st.t.Helper()
	nc, err := bus.Connect(context.Background(), bus.ConnectConfig{Home: st.bus.Home, User: bus.UserPortfwd, URL: st.bus.URL})
	if err != nil {
		st.t.Fatal(err)
	}
	cfg := st.cfg
	cfg.Bus = nc
	svc, err := New(cfg)
	if err != nil {
		st.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	exited := make(chan struct{})
	go func() { runErr = svc.Run(ctx); close(exited) }()
	st.stopSvc = func() {
		cancel()
		<-exited
		if runErr != nil {
			st.t.Errorf("portfwd Run: %v", runErr)
		}
		nc.Close()
	}
	testutil.WaitFor(st.t, 10*time.Second, func() error {
		select {
		case <-exited:
			st.t.Fatalf("portfwd Run returned: %v", runErr)
		default:
		}
		_, err := st.list("")
		return err
	})
}

func (st *stack) list(id string) ([]api.Forward, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return api.NewClient(st.gw, bus.LocalHost).List(ctx, api.ListRequest{ID: id})
}

// listeners publishes the vmm's listener set of a sandbox, as the vmm of the service's host.
func (st *stack) listeners(id, name string, ports ...uint16) {
	st.t.Helper()
	st.listenersOf(st.cfg.Host, id, name, ports...)
}

// listenersOf publishes the listener set of a sandbox as the vmm of host.
func (st *stack) listenersOf(host, id, name string, ports ...uint16) {
	st.t.Helper()
	ev := api.ListenersEvent{Type: api.TypeListeners, ID: id, Name: name, Ports: []api.Port{}, Time: time.Now(), Host: host}
	for _, p := range ports {
		ev.Ports = append(ev.Ports, api.Port{Port: p, Addr: "127.0.0.1"})
	}
	b, _ := json.Marshal(ev)
	if err := st.vmm.Publish(api.EventSubject(id), b); err != nil {
		st.t.Fatal(err)
	}
	st.vmm.Flush()
}

// lifecycle publishes a sandbox state change as the gateway does.
func (st *stack) lifecycle(id, name string, to gwapi.State) {
	st.t.Helper()
	b, _ := json.Marshal(gwapi.Event{Type: "state", Sandbox: name, ID: id, To: to, Time: time.Now()})
	if err := st.gw.Publish(gwapi.EventSubject(id), b); err != nil {
		st.t.Fatal(err)
	}
	st.gw.Flush()
}

// fakeGuest serves the hybrid-vsock CONNECT protocol on the sandbox's vsock.sock, relaying
// guest ports to the given loopback backends. It counts the CONNECTs it answered.
type fakeGuest struct {
	mu       sync.Mutex
	backends map[int]string
	connects int
}

func (g *fakeGuest) set(port int, addr string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if addr == "" {
		delete(g.backends, port)
	} else {
		g.backends[port] = addr
	}
}

func startFakeGuest(t testing.TB, st *stack, id string) *fakeGuest {
	t.Helper()
	dir := st.bus.Home.Sandbox(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "vsock.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	g := &fakeGuest{backends: map[int]string{}}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				port, err := agentproto.ReadConnectLine(c)
				g.mu.Lock()
				addr := g.backends[port]
				g.mu.Unlock()
				if err != nil || addr == "" {
					c.Close()
					return
				}
				b, err := net.Dial("tcp", addr)
				if err != nil {
					c.Close()
					return
				}
				g.mu.Lock()
				g.connects++
				g.mu.Unlock()
				c.Write(agentproto.ConnectOK(port))
				agentproto.Splice(c, b)
			}()
		}
	}()
	return g
}

// echoServer is a loopback TCP echo server.
func echoServer(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	return l.Addr().String()
}

var handedOut sync.Map

// freePort picks a port in the forwarded range that nothing on this host listens on and that
// no other test of this process got.
func freePort(t testing.TB) uint16 {
	t.Helper()
	for range 200 {
		p := uint16(api.MinPort + rand.IntN(api.MaxPort-api.MinPort+1))
		if _, dup := handedOut.LoadOrStore(p, true); dup {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(int(p)))
		if err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no free port in range")
	return 0
}

func hostAddr(p uint16) string { return "127.0.0.1:" + strconv.Itoa(int(p)) }

// echoOnce sends a line through the host port and checks it comes back.
func echoOnce(p uint16, msg string) error {
	c, err := net.DialTimeout("tcp", hostAddr(p), 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if line != msg+"\n" {
		return fmt.Errorf("echo %q, want %q", line, msg)
	}
	return nil
}

// portFree reports nil when nothing listens on the host port any more.
func portFree(p uint16) error {
	l, err := net.Listen("tcp", hostAddr(p))
	if err != nil {
		return fmt.Errorf("port %d still held: %w", p, err)
	}
	l.Close()
	return nil
}

func forwardState(st *stack, id string, p uint16) (api.Forward, error) {
	list, err := st.list(id)
	if err != nil {
		return api.Forward{}, err
	}
	for _, f := range list {
		if f.Port == p {
			return f, nil
		}
	}
	return api.Forward{}, fmt.Errorf("no forward of port %d in %+v", p, list)
}

func TestForwardEchoAndHTTP(t *testing.T) {
	st := newStack(t, nil)
	g := startFakeGuest(t, st, "sb-echo")
	pEcho, pHTTP := freePort(t), freePort(t)
	g.set(int(pEcho), echoServer(t))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.URL.Path) })}
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(hl)
	t.Cleanup(func() { srv.Close() })
	g.set(int(pHTTP), hl.Addr().String())

	st.listeners("sb-echo", "default/echo", pEcho, pHTTP)
	testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(pEcho, "ping") })
	testutil.WaitFor(t, 5*time.Second, func() error {
		resp, err := http.Get("http://" + hostAddr(pHTTP) + "/x")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "hello from /x" {
			return fmt.Errorf("body %q", b)
		}
		return nil
	})
	f, err := forwardState(st, "sb-echo", pEcho)
	if err != nil {
		t.Fatal(err)
	}
	if f.State != api.StateForwarding || f.Sandbox != "default/echo" || f.HostAddr != hostAddr(pEcho) || f.GuestAddr != "127.0.0.1" || f.Since.IsZero() {
		t.Fatalf("forward record %+v", f)
	}
	// The record is in KV nexus_ports under <id>.<port>.
	kv, err := bus.KV(context.Background(), st.bus.Connect(t, bus.UserAdmin), bus.KVPorts)
	if err == nil {
		_, err = kv.Get(context.Background(), key("sb-echo", pEcho))
	}
	if err != nil {
		t.Fatalf("KV record: %v", err)
	}
}

func TestFiftyConcurrentConnections(t *testing.T) {
	st := newStack(t, nil)
	g := startFakeGuest(t, st, "sb-many")
	p := freePort(t)
	g.set(int(p), echoServer(t))
	st.listeners("sb-many", "default/many", p)
	testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(p, "warm") })

	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// 64 KiB each way per connection, so the splices really run concurrently.
			c, err := net.DialTimeout("tcp", hostAddr(p), 5*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			msg := []byte(strings.Repeat(strconv.Itoa(i%10), 64<<10))
			go c.Write(msg)
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil {
				errs <- fmt.Errorf("conn %d: %w", i, err)
				return
			}
			if string(got) != string(msg) {
				errs <- fmt.Errorf("conn %d: payload mismatch", i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestReleaseOnListenerClose measures the portfwd half of the release latency: from the
// vmm's listener set without the port to the host port being free.
func TestReleaseOnListenerClose(t *testing.T) {
	st := newStack(t, nil)
	g := startFakeGuest(t, st, "sb-rel")
	p, keep := freePort(t), freePort(t)
	g.set(int(p), echoServer(t))
	g.set(int(keep), echoServer(t))
	st.listeners("sb-rel", "default/rel", p, keep)
	testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(p, "x") })
	// An established connection survives the listener closing (as it does in the guest).
	c, err := net.Dial("tcp", hostAddr(p))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	events := subscribeForward(t, st, "sb-rel")
	start := time.Now()
	st.listeners("sb-rel", "default/rel", keep)
	testutil.WaitFor(t, 2*time.Second, func() error { return portFree(p) })
	t.Logf("release latency (listener set → host port free): %s", time.Since(start))
	waitEvent(t, events, func(e api.ForwardEvent) bool {
		return e.Port == p && e.State == api.StateReleased && e.Reason == "listener closed"
	})
	if err := echoOnce(keep, "still"); err != nil {
		t.Fatalf("other forward of the sandbox: %v", err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "late\n")
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "late\n" {
		t.Fatalf("established connection after release: %q %v", line, err)
	}
	if _, err := forwardState(st, "sb-rel", p); err == nil {
		t.Fatal("released port still listed")
	}
}

func subscribeForward(t testing.TB, st *stack, id string) chan api.ForwardEvent {
	t.Helper()
	ch := make(chan api.ForwardEvent, 64)
	sub, err := st.gw.Subscribe(api.EventSubject(id), func(m *nats.Msg) {
		var e api.ForwardEvent
		if json.Unmarshal(m.Data, &e) == nil && e.Type == api.TypeForward {
			select {
			case ch <- e:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	st.gw.Flush()
	t.Cleanup(func() { sub.Unsubscribe() })
	return ch
}

func waitEvent(t testing.TB, ch chan api.ForwardEvent, ok func(api.ForwardEvent) bool) api.ForwardEvent {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case e := <-ch:
			if ok(e) {
				return e
			}
		case <-timeout:
			t.Fatal("expected port event did not arrive")
		}
	}
}

func TestConflictWithHostProcess(t *testing.T) {
	st := newStack(t, nil)
	g := startFakeGuest(t, st, "sb-hc")
	p := freePort(t)
	g.set(int(p), echoServer(t))
	held, err := net.Listen("tcp", hostAddr(p))
	if err != nil {
		t.Fatal(err)
	}
	events := subscribeForward(t, st, "sb-hc")
	st.listeners("sb-hc", "default/hc", p)
	e := waitEvent(t, events, func(e api.ForwardEvent) bool { return e.State == api.StateConflict })
	wantHolder := fmt.Sprintf("host process %d (", os.Getpid())
	if e.Port != p || !strings.HasPrefix(e.Holder, wantHolder) {
		t.Fatalf("conflict event %+v, want holder %q…", e, wantHolder)
	}
	f, err := forwardState(st, "sb-hc", p)
	if err != nil || f.State != api.StateConflict || f.Holder != e.Holder {
		t.Fatalf("list: %+v %v", f, err)
	}
	// The number is never changed: nothing else was bound for this sandbox.
	if list, _ := st.list("sb-hc"); len(list) != 1 {
		t.Fatalf("list %+v", list)
	}
	// Once the host process lets go, the next listener set (the vmm republishes) takes it.
	held.Close()
	st.listeners("sb-hc", "default/hc", p)
	testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(p, "mine now") })
	waitEvent(t, events, func(e api.ForwardEvent) bool { return e.State == api.StateForwarding })
}

func TestConflictBetweenSandboxes(t *testing.T) {
	st := newStack(t, nil)
	ga, gb := startFakeGuest(t, st, "sb-a"), startFakeGuest(t, st, "sb-b")
	p := freePort(t)
	// Two different backends so the test sees whose guest answers.
	ga.set(int(p), httpBackend(t, "A"))
	gb.set(int(p), httpBackend(t, "B"))
	st.listeners("sb-a", "proj/a", p)
	testutil.WaitFor(t, 5*time.Second, func() error { return wantBody(p, "A") })
	events := subscribeForward(t, st, "sb-b")
	st.listeners("sb-b", "proj/b", p)
	e := waitEvent(t, events, func(e api.ForwardEvent) bool { return e.State == api.StateConflict })
	if e.Holder != "sandbox proj/a" {
		t.Fatalf("holder %q", e.Holder)
	}
	all, err := st.list("")
	if err != nil || len(all) != 2 || all[0].Sandbox != "proj/a" || all[0].State != api.StateForwarding ||
		all[1].Sandbox != "proj/b" || all[1].State != api.StateConflict || all[1].Holder != "sandbox proj/a" {
		t.Fatalf("list %+v %v", all, err)
	}
	if err := wantBody(p, "A"); err != nil {
		t.Fatalf("first sandbox lost its port: %v", err)
	}
	// The first sandbox stops: the port goes to the one that waited.
	st.lifecycle("sb-a", "proj/a", gwapi.StateStopping)
	testutil.WaitFor(t, 5*time.Second, func() error { return wantBody(p, "B") })
	waitEvent(t, events, func(e api.ForwardEvent) bool { return e.State == api.StateForwarding })
}

func httpBackend(t testing.TB, body string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

func wantBody(p uint16, want string) error {
	cl := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Get("http://" + hostAddr(p) + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if string(b) != want {
		return fmt.Errorf("body %q, want %q", b, want)
	}
	return nil
}

func TestRestartRestoresFromKV(t *testing.T) {
	st := newStack(t, func(c *Config) { c.RestoreGrace = 2 * time.Second })
	g := startFakeGuest(t, st, "sb-rs")
	p, gone := freePort(t), freePort(t)
	g.set(int(p), echoServer(t))
	st.listeners("sb-rs", "default/rs", p)
	// A second sandbox whose VM will be gone when portfwd comes back.
	startFakeGuest(t, st, "sb-gone")
	st.listeners("sb-gone", "default/gone", gone)
	testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(p, "before") })
	testutil.WaitFor(t, 5*time.Second, func() error {
		if f, err := forwardState(st, "sb-gone", gone); err != nil || f.State != api.StateForwarding {
			return fmt.Errorf("%+v %v", f, err)
		}
		return nil
	})

	st.stopSvc()
	if err := portFree(p); err != nil {
		t.Fatalf("a stopped portfwd must release its ports: %v", err)
	}
	st.start()
	// Back without any new listener set (the restore runs as the service starts).
	testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(p, "after") })
	if f, err := forwardState(st, "sb-rs", p); err != nil || f.State != api.StateForwarding || f.Sandbox != "default/rs" {
		t.Fatalf("restored record %+v %v", f, err)
	}
	// The vmm confirms sb-rs; nothing confirms sb-gone, which is released after the grace.
	deadline := time.Now().Add(6 * time.Second)
	testutil.WaitFor(t, 8*time.Second, func() error {
		if time.Now().Before(deadline) {
			st.listeners("sb-rs", "default/rs", p) // the vmm's periodic republish
		}
		return portFree(gone)
	})
	if err := echoOnce(p, "confirmed"); err != nil {
		t.Fatalf("confirmed forward lost: %v", err)
	}
}

// TestOtherHostsSandbox: in a cluster every forwarder hears every host's listener sets and
// shares the KV bucket; it opens the ports of its own host's sandboxes only, and leaves another
// host's records alone when it restores.
func TestOtherHostsSandbox(t *testing.T) {
	st := newStack(t, nil) // the host's name is LocalHost
	startFakeGuest(t, st, "sb-h2")
	p := freePort(t)
	st.listenersOf("h2", "sb-h2", "default/on-h2", p)
	st.probe()
	if err := portFree(p); err != nil {
		t.Fatalf("this host's forwarder opened a port of a sandbox on h2: %v", err)
	}
	if list, _ := st.list(""); len(list) != 0 {
		t.Fatalf("this host's forwarder lists another host's sandbox: %+v", list)
	}
	// h2's forwarder recorded a forward of its own sandbox in the shared bucket.
	kv, err := bus.KV(context.Background(), st.bus.Connect(t, bus.UserAdmin), bus.KVPorts)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(api.Forward{ID: "sb-h2", Sandbox: "default/on-h2", Port: p, GuestAddr: "127.0.0.1",
		HostAddr: hostAddr(p), State: api.StateForwarding, Since: time.Now().UTC(), Host: "h2"})
	if _, err := kv.Put(context.Background(), key("sb-h2", p), rec); err != nil {
		t.Fatal(err)
	}
	st.stopSvc()
	st.start()
	st.probe()
	if err := portFree(p); err != nil {
		t.Fatalf("this host's forwarder restored h2's forward: %v", err)
	}
	if _, err := kv.Get(context.Background(), key("sb-h2", p)); err != nil {
		t.Fatalf("this host's forwarder dropped h2's record: %v", err)
	}
	// The same set from this host's own vmm is forwarded.
	st.listenersOf(bus.LocalHost, "sb-h2", "default/on-h2", p)
	testutil.WaitFor(t, 5*time.Second, func() error {
		f, err := forwardState(st, "sb-h2", p)
		if err == nil && (f.State != api.StateForwarding || f.Host != bus.LocalHost) {
			err = fmt.Errorf("forward %+v", f)
		}
		return err
	})
}

func TestRestoreDropsStoppedSandbox(t *testing.T) {
	st := newStack(t, nil)
	startFakeGuest(t, st, "sb-st")
	p := freePort(t)
	st.listeners("sb-st", "default/st", p)
	testutil.WaitFor(t, 5*time.Second, func() error {
		_, err := forwardState(st, "sb-st", p)
		return err
	})
	st.stopSvc()
	// Stopped while portfwd was down: the lifecycle event is in the events stream.
	jetstreamPublish(t, st, gwapi.EventSubject("sb-st"), gwapi.Event{Type: "state", Sandbox: "default/st", ID: "sb-st", To: gwapi.StateStopped})
	st.start()
	if err := portFree(p); err != nil {
		t.Fatalf("forward of a stopped sandbox restored: %v", err)
	}
	if list, _ := st.list(""); len(list) != 0 {
		t.Fatalf("list %+v", list)
	}
	// A stale listener set of the stopped sandbox is ignored too.
	st.listeners("sb-st", "default/st", p)
	st.probe()
	if err := portFree(p); err != nil {
		t.Fatal(err)
	}
}

// probe publishes a listener set for a probe sandbox and waits until it is forwarded: the
// service handles events in order, so every event published before has been handled.
func (st *stack) probe() {
	st.t.Helper()
	p := freePort(st.t)
	st.listeners("sb-probe", "default/probe", p)
	testutil.WaitFor(st.t, 5*time.Second, func() error {
		_, err := forwardState(st, "sb-probe", p)
		return err
	})
	st.listeners("sb-probe", "default/probe")
	testutil.WaitFor(st.t, 5*time.Second, func() error { return portFree(p) })
}

// jetstreamPublish publishes into the events stream and waits for the stream's ack.
func jetstreamPublish(t testing.TB, st *stack, subject string, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if _, err := st.gw.Request(subject, b, 2*time.Second); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

func TestLifecycleEndsForwards(t *testing.T) {
	st := newStack(t, nil)
	g := startFakeGuest(t, st, "sb-lc")
	p := freePort(t)
	g.set(int(p), echoServer(t))
	st.lifecycle("sb-lc", "default/lc", gwapi.StateRunning)
	st.listeners("sb-lc", "default/lc", p)
	testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(p, "up") })

	// Pause ends the forward and its connections; resume brings it back from the last set.
	c, err := net.Dial("tcp", hostAddr(p))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st.lifecycle("sb-lc", "default/lc", gwapi.StatePaused)
	testutil.WaitFor(t, 2*time.Second, func() error { return portFree(p) })
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("relayed connection not closed on pause: %v", err)
	}
	st.listeners("sb-lc", "default/lc", p) // a set that raced the pause
	st.lifecycle("sb-lc", "default/lc", gwapi.StateRunning)
	testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(p, "resumed") })

	for _, to := range []gwapi.State{gwapi.StateStopping, gwapi.StateFailed, gwapi.StateRemoving} {
		st.lifecycle("sb-lc", "default/lc", to)
		testutil.WaitFor(t, 2*time.Second, func() error { return portFree(p) })
		// Boot again: a new listener set forwards again.
		st.lifecycle("sb-lc", "default/lc", gwapi.StateStarting)
		st.listeners("sb-lc", "default/lc", p)
		testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(p, "again after "+string(to)) })
	}
	// The vmm's last (empty) set when the VM ends also releases.
	st.listeners("sb-lc", "default/lc")
	testutil.WaitFor(t, 2*time.Second, func() error { return portFree(p) })
}

func TestOutOfRangeAndBadEvents(t *testing.T) {
	st := newStack(t, nil)
	startFakeGuest(t, st, "sb-or")
	low, high := uint16(1023), uint16(api.MaxPort+1)
	in := freePort(t)
	// Out-of-range ports are dropped, whatever the publisher sent.
	st.listeners("sb-or", "default/or", low, high, in)
	testutil.WaitFor(t, 5*time.Second, func() error {
		_, err := forwardState(st, "sb-or", in)
		return err
	})
	list, _ := st.list("sb-or")
	if len(list) != 1 {
		t.Fatalf("out of range ports forwarded: %+v", list)
	}
	// An id that is not a sandbox id, or does not match its subject, is ignored.
	for _, ev := range []api.ListenersEvent{
		{Type: api.TypeListeners, ID: "../../etc", Ports: []api.Port{{Port: freePort(t)}}},
		{Type: api.TypeListeners, ID: "sb-other", Ports: []api.Port{{Port: freePort(t)}}},
	} {
		b, _ := json.Marshal(ev)
		st.vmm.Publish(api.EventSubject("sb-or2"), b)
	}
	st.vmm.Publish(api.EventSubject("sb-or3"), []byte("{not json"))
	st.probe()
	if all, _ := st.list(""); len(all) != 1 {
		t.Fatalf("bad events made forwards: %+v", all)
	}
}

func TestNoGuestListenerClosesConnection(t *testing.T) {
	st := newStack(t, func(c *Config) { c.ConnectTimeout = 2 * time.Second })
	startFakeGuest(t, st, "sb-ng") // answers no port at all
	p := freePort(t)
	st.listeners("sb-ng", "default/ng", p)
	testutil.WaitFor(t, 5*time.Second, func() error {
		_, err := forwardState(st, "sb-ng", p)
		return err
	})
	c, err := net.Dial("tcp", hostAddr(p))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read from a refused relay: %v, want EOF", err)
	}
}

func TestReadOK(t *testing.T) {
	for in, ok := range map[string]bool{
		"OK 5173\n": true, "OK 5173\nhello": true, "OK 5174\n": false, "ok 5173\n": false, "OK 5173": false,
		"": false, strings.Repeat("O", 40) + "\n": false, "OK  5173\n": false,
	} {
		r := strings.NewReader(in)
		err := ReadOK(r, 5173)
		if (err == nil) != ok {
			t.Errorf("%q: %v", in, err)
		}
		if ok {
			if rest, _ := io.ReadAll(r); strings.HasSuffix(in, "hello") && string(rest) != "hello" {
				t.Errorf("%q: over-read, rest %q", in, rest)
			}
		}
	}
}

func TestListeningInodes(t *testing.T) {
	data := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 0100007F:1435 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0 100 0 0 10 0\n" +
		"   1: 0100007F:1435 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 4243 1 0 20 4 30 10 -1\n" +
		"   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0 100 0 0 10 0\n"
	got := listeningInodes([]byte(data), 5173)
	if len(got) != 1 || got[0] != "4242" {
		t.Fatalf("inodes %v", got)
	}
}

func FuzzDecodeListeners(f *testing.F) {
	f.Add([]byte(`{"type":"listeners","id":"sb-1","name":"a/b","ports":[{"port":5173,"addr":"127.0.0.1"}]}`))
	f.Add([]byte(`{"type":"listeners","id":"sb-1","ports":[{"port":80},{"port":5173},{"port":5173}]}`))
	f.Add([]byte(`{"type":"forward","id":"sb-1"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := decodeListeners(api.EventSubject("sb-1"), data)
		if err != nil {
			return
		}
		if ev.ID != "sb-1" {
			t.Fatalf("id %q accepted", ev.ID)
		}
		seen := map[uint16]bool{}
		for _, p := range ev.Ports {
			if !api.InRange(int(p.Port)) || seen[p.Port] {
				t.Fatalf("port %d kept", p.Port)
			}
			seen[p.Port] = true
		}
	})
}

func FuzzReadOK(f *testing.F) {
	f.Add([]byte("OK 5173\n"), uint16(5173))
	f.Add([]byte("OK 1\nrest"), uint16(1))
	f.Add([]byte("ERR\n"), uint16(22))
	f.Fuzz(func(t *testing.T, data []byte, port uint16) {
		r := strings.NewReader(string(data))
		if ReadOK(r, int(port)) == nil {
			want := "OK " + strconv.Itoa(int(port)) + "\n"
			if !strings.HasPrefix(string(data), want) || r.Len() != len(data)-len(want) {
				t.Fatalf("accepted %q for port %d", data, port)
			}
		}
	})
}

// testLog logs to the test's output when -v is given, else nowhere.
func testLog(t testing.TB) zerolog.Logger {
	if !testing.Verbose() {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Logger()
}
