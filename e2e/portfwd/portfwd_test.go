package portfwd

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/portfwd"
	"github.com/IniZio/nexus/services/portfwd"
)

func addr(p uint16) string { return "127.0.0.1:" + strconv.Itoa(int(p)) }

// hostFree reports nil when nothing listens on the host port.
func hostFree(p uint16) error {
	l, err := net.Listen("tcp", addr(p))
	if err != nil {
		return fmt.Errorf("host port %d held: %w", p, err)
	}
	l.Close()
	return nil
}

// freeInRange picks a port in the forwarded range free on the host.
func freeInRange(t testing.TB, avoid ...uint16) uint16 {
	t.Helper()
	for p := uint16(7100 + os.Getpid()%1000); p < api.MaxPort; p++ {
		skip := false
		for _, a := range avoid {
			skip = skip || a == p
		}
		if !skip && hostFree(p) == nil {
			return p
		}
	}
	t.Fatal("no free port in range")
	return 0
}

// curl fetches a URL with the host's curl (net/http when curl is missing).
func curl(url string) (string, error) {
	if _, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command("curl", "-sS", "--max-time", "5", url).CombinedOutput()
		return string(out), err
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// startGuestSrv runs guestsrv MODE on 127.0.0.1:port in the guest, in its own session, and
// returns once it listens: the exec's process group is killed when the exec session ends, so
// a child must be past setsid before the shell exits.
func startGuestSrv(t testing.TB, s *stack, name, mode string, port uint16) {
	t.Helper()
	s.guest(t, name, fmt.Sprintf("setsid /tmp/guestsrv %s 127.0.0.1:%d </dev/null >/tmp/guestsrv-%d.log 2>&1 & ", mode, port, port)+waitListen(port))
}

// waitListen is a guest shell loop that waits (up to 60 s) until ports listen.
func waitListen(ports ...uint16) string {
	var b strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&b, "i=0; until netstat -ltn | grep -q ':%d '; do i=$((i+1)); [ $i -gt 600 ] && exit 1; sleep 0.1; done; ", p)
	}
	return b.String()
}

func killGuest(t testing.TB, s *stack, name, pattern string) {
	t.Helper()
	s.guest(t, name, fmt.Sprintf("kill $(ps | awk '/[%c]%s/{print $1}')", pattern[0], pattern[1:]))
}

func waitForwarding(t testing.TB, s *stack, name string, p uint16) api.Forward {
	t.Helper()
	var f api.Forward
	// Generous: a static Go server starts slowly in a TCG guest on a busy machine.
	err := testutil.Poll(30*time.Second, func() error {
		var err error
		if f, err = s.forward(name, p); err != nil {
			return err
		}
		if f.State != api.StateForwarding {
			return fmt.Errorf("port %d is %s", p, f.State)
		}
		return nil
	})
	if err != nil {
		diag, _ := s.nexus("exec", name, "--", "sh", "-c", "netstat -ltn; ps | grep -v '\\['; ls -la /tmp; tail -n 5 /tmp/guestsrv-*.log")
		t.Fatalf("port %d of %s not forwarding: %v\nguest:\n%s", p, name, err, diag)
	}
	return f
}

// TestHTTPServerOn5173 is the scenario: a dev server on 127.0.0.1:5173 in the guest
// answers curl 127.0.0.1:5173 on the host; closing it frees the host port within the interval.
func TestHTTPServerOn5173(t *testing.T) {
	s := need(t)
	const p = 5173
	if err := hostFree(p); err != nil {
		t.Fatalf("this test needs host port 5173 free: %v", err)
	}
	s.guest(t, sandbox, "mkdir -p /tmp/www && echo hello-from-guest > /tmp/www/index.html && busybox httpd -p 127.0.0.1:5173 -h /tmp/www; "+waitListen(p))
	testutil.WaitFor(t, 30*time.Second, func() error {
		out, err := curl("http://127.0.0.1:5173/")
		if err != nil || out != "hello-from-guest\n" {
			return fmt.Errorf("curl: %q %v", out, err)
		}
		return nil
	})
	f := waitForwarding(t, s, sandbox, p)
	if f.Sandbox != "default/"+sandbox || f.HostAddr != "127.0.0.1:5173" || f.GuestAddr != "127.0.0.1" {
		t.Fatalf("nexus ports row %+v", f)
	}
	table, err := s.nexus("ports")
	if err != nil || !strings.Contains(table, "default/pf") || !strings.Contains(table, "5173") || !strings.Contains(table, "forwarding") {
		t.Fatalf("nexus ports table:\n%s %v", table, err)
	}

	// 50 concurrent connections through the one forward all complete.
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := c.Get("http://127.0.0.1:5173/")
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "hello-from-guest\n" {
				errs <- fmt.Errorf("body %q", b)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Release: from the guest listener closing to the host port being free.
	killGuest(t, s, sandbox, "httpd -p 127.0.0.1:5173")
	closed := time.Now()
	testutil.WaitFor(t, 5*time.Second, func() error { return hostFree(p) })
	latency := time.Since(closed)
	t.Logf("release latency (guest listener closed → host port 5173 free): %s", latency.Round(time.Millisecond))
	if latency > 2*time.Second {
		t.Errorf("release took %s, goal ≤ 2s", latency)
	}
	if _, err := s.forward(sandbox, p); err == nil {
		t.Fatal("5173 still listed after release")
	}
}

// TestOutOfRangeNotForwarded: listeners above 11023 (and below 1024) stay in the guest.
func TestOutOfRangeNotForwarded(t *testing.T) {
	s := need(t)
	high, low, in := uint16(api.MaxPort+1), uint16(1023), freeInRange(t)
	if hostFree(high) != nil {
		t.Skipf("host port %d is in use here", high)
	}
	// All three start together: once the in-range one is forwarded the vmm has seen them all.
	s.guest(t, sandbox, fmt.Sprintf(
		"for p in %d %d %d; do setsid /tmp/guestsrv echo 127.0.0.1:$p </dev/null >/dev/null 2>&1 & done; ", high, low, in)+waitListen(high, low, in))
	waitForwarding(t, s, sandbox, in)
	// The vmm polls every 500 ms and publishes on change: a second forwarded round rules out
	// a set that was read before all three listened.
	in2 := freeInRange(t, in)
	startGuestSrv(t, s, sandbox, "echo", in2)
	waitForwarding(t, s, sandbox, in2)
	list, err := s.ports(sandbox)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range list {
		if f.Port == high || f.Port == low {
			t.Fatalf("out-of-range port forwarded: %+v", f)
		}
	}
	if err := hostFree(high); err != nil {
		t.Fatal(err)
	}
	killGuest(t, s, sandbox, "guestsrv echo")
	testutil.WaitFor(t, 5*time.Second, func() error { return hostFree(in) })
}

// TestWebSocketEcho: an HMR-style WebSocket through the forward.
func TestWebSocketEcho(t *testing.T) {
	s := need(t)
	p := freeInRange(t)
	startGuestSrv(t, s, sandbox, "ws", p)
	waitForwarding(t, s, sandbox, p)
	var c *websocket.Conn
	testutil.WaitFor(t, 30*time.Second, func() error {
		var err error
		c, _, err = websocket.DefaultDialer.Dial("ws://"+addr(p)+"/", nil)
		return err
	})
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for i := range 20 {
		msg := strings.Repeat(strconv.Itoa(i), 1+i*1000)
		if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		typ, got, err := c.ReadMessage()
		if err != nil || typ != websocket.TextMessage || string(got) != msg {
			t.Fatalf("message %d: type %d, %d bytes, %v", i, typ, len(got), err)
		}
	}
	killGuest(t, s, sandbox, "guestsrv ws")
	testutil.WaitFor(t, 5*time.Second, func() error { return hostFree(p) })
}

// TestConflictWithHostProcess: a host port already taken is reported, never renumbered.
func TestConflictWithHostProcess(t *testing.T) {
	s := need(t)
	p := freeInRange(t)
	held, err := net.Listen("tcp", addr(p))
	if err != nil {
		t.Fatal(err)
	}
	startGuestSrv(t, s, sandbox, "echo", p)
	var f api.Forward
	testutil.WaitFor(t, 30*time.Second, func() error {
		if f, err = s.forward(sandbox, p); err != nil {
			return err
		}
		if f.State != api.StateConflict {
			return fmt.Errorf("state %s", f.State)
		}
		return nil
	})
	if want := fmt.Sprintf("host process %d (", os.Getpid()); !strings.HasPrefix(f.Holder, want) {
		t.Fatalf("holder %q, want %q…", f.Holder, want)
	}
	table, _ := s.nexus("ports", sandbox)
	if !strings.Contains(table, "conflict") || !strings.Contains(table, "host process") {
		t.Fatalf("nexus ports:\n%s", table)
	}
	// The holder lets go: the next republish of the set (≤ 5 s) takes the port.
	held.Close()
	waitForwarding(t, s, sandbox, p)
	echo(t, p)
	killGuest(t, s, sandbox, "guestsrv echo")
	testutil.WaitFor(t, 5*time.Second, func() error { return hostFree(p) })
}

func echo(t testing.TB, p uint16) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, func() error {
		c, err := net.DialTimeout("tcp", addr(p), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "ping\n")
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping\n" {
			return fmt.Errorf("echo %q %v", buf, err)
		}
		return nil
	})
}

// TestConflictBetweenSandboxes: the same port in two sandboxes; the first keeps it; the
// second gets it when the first stops; --no-port-forward sandboxes never claim.
func TestConflictBetweenSandboxes(t *testing.T) {
	s := need(t)
	p := freeInRange(t)
	startGuestSrv(t, s, sandbox, "echo", p)
	waitForwarding(t, s, sandbox, p)
	for _, c := range [][]string{
		{"create", "pf2", "--image", "nexus-mini", "--memory", "256"},
		{"create", "pfnone", "--image", "nexus-mini", "--memory", "256", "--no-port-forward"},
	} {
		if out, err := s.nexusT(5*time.Minute, c...); err != nil {
			t.Fatalf("nexus %v: %v: %s", c, err, out)
		}
	}
	defer s.nexus("rm", "--force", "pf2", "pfnone")
	for _, n := range []string{"pf2", "pfnone"} {
		s.copyGuestSrv(t, n)
	}
	q := freeInRange(t, p)
	startGuestSrv(t, s, "pfnone", "echo", q)
	startGuestSrv(t, s, "pfnone", "echo", p)
	startGuestSrv(t, s, "pf2", "echo", p)
	var f api.Forward
	testutil.WaitFor(t, 30*time.Second, func() error {
		var err error
		if f, err = s.forward("pf2", p); err != nil {
			return err
		}
		if f.State != api.StateConflict {
			return fmt.Errorf("pf2 port %d is %s", p, f.State)
		}
		return nil
	})
	if f.Holder != "sandbox default/pf" {
		t.Fatalf("holder %q", f.Holder)
	}
	if own, err := s.forward(sandbox, p); err != nil || own.State != api.StateForwarding {
		t.Fatalf("first sandbox lost its port: %+v %v", own, err)
	}
	// The first one stops: the waiting sandbox takes over the same number.
	if out, err := s.nexus("stop", sandbox); err != nil {
		t.Fatalf("stop: %v: %s", err, out)
	}
	waitForwarding(t, s, "pf2", p)
	echo(t, p)
	// Nothing of the --no-port-forward sandbox was ever forwarded (it listens on q since
	// before pf2's conflict was reported, and the vmm polls every 500 ms).
	if list, err := s.ports("pfnone"); err != nil || len(list) != 0 {
		t.Fatalf("--no-port-forward sandbox has forwards: %+v %v", list, err)
	}
	if err := hostFree(q); err != nil {
		t.Fatal(err)
	}
	if out, err := s.nexusT(5*time.Minute, "start", sandbox); err != nil {
		t.Fatalf("start: %v: %s", err, out)
	}
	s.copyGuestSrv(t, sandbox) // /tmp does not survive a reboot
}

// TestPauseAndRestart: pause ends the forwards, resume brings them back; a restarted portfwd
// binds its forwards again from KV nexus_ports.
func TestPauseAndRestart(t *testing.T) {
	s := need(t)
	p := freeInRange(t)
	startGuestSrv(t, s, sandbox, "echo", p)
	waitForwarding(t, s, sandbox, p)
	echo(t, p)

	if out, err := s.nexus("pause", sandbox); err != nil {
		t.Fatalf("pause: %v: %s", err, out)
	}
	testutil.WaitFor(t, 2*time.Second, func() error { return hostFree(p) })
	if out, err := s.nexus("resume", sandbox); err != nil {
		t.Fatalf("resume: %v: %s", err, out)
	}
	echo(t, p)

	s.stopService("portfwd")
	if err := hostFree(p); err != nil {
		t.Fatalf("a stopped portfwd holds its ports: %v", err)
	}
	if err := s.startService("portfwd"); err != nil {
		t.Fatal(err)
	}
	echo(t, p)
	log, _ := os.ReadFile(s.root + "/logs/portfwd.log")
	if !strings.Contains(string(log), "restored forwards") {
		t.Fatalf("portfwd did not restore from KV; log:\n%s", log)
	}
	killGuest(t, s, sandbox, "guestsrv echo")
	testutil.WaitFor(t, 5*time.Second, func() error { return hostFree(p) })
}

// Benchmarks through a real guest: connect + first byte, and host → guest throughput.

var benchOnce sync.Once
var benchEcho, benchSink uint16

func benchPorts(b *testing.B) (uint16, uint16) {
	s := need(b)
	benchOnce.Do(func() {
		benchEcho = freeInRange(b)
		benchSink = freeInRange(b, benchEcho)
		startGuestSrv(b, s, sandbox, "echo", benchEcho)
		startGuestSrv(b, s, sandbox, "sink", benchSink)
	})
	waitForwarding(b, s, sandbox, benchEcho)
	waitForwarding(b, s, sandbox, benchSink)
	return benchEcho, benchSink
}

// dialer returns how a benchmark reaches a guest port: through the host forward, or straight
// over the sandbox's hybrid-vsock socket (the channel the forward rides on, without it).
func dialer(b *testing.B, viaForward bool, p uint16) func() (net.Conn, error) {
	if viaForward {
		return func() (net.Conn, error) { return net.Dial("tcp", addr(p)) }
	}
	f, err := st.forward(sandbox, p)
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(st.root, "nexus", "sandboxes", f.ID, "vsock.sock")
	return func() (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return portfwd.DialGuest(ctx, sock, int(p))
	}
}

func benchConnect(b *testing.B, viaForward bool) {
	p, _ := benchPorts(b)
	dial := dialer(b, viaForward, p)
	buf := make([]byte, 1)
	b.ResetTimer()
	for range b.N {
		c, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		c.Write([]byte{'x'})
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

func benchThroughput(b *testing.B, viaForward bool) {
	_, p := benchPorts(b)
	c, err := dialer(b, viaForward, p)()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const chunk = 256 << 10
	buf := make([]byte, chunk)
	b.SetBytes(chunk)
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	var n int64
	if err := binary.Read(c, binary.BigEndian, &n); err != nil {
		b.Fatal(err)
	}
	if n != int64(b.N)*chunk {
		b.Fatalf("guest got %d of %d bytes", n, int64(b.N)*chunk)
	}
}

// BenchmarkGuestForwardConnect: connect + first byte round trip via 127.0.0.1:<port>.
func BenchmarkGuestForwardConnect(b *testing.B) { benchConnect(b, true) }

// BenchmarkGuestVsockConnect: the same over the hybrid-vsock socket, without the forward.
func BenchmarkGuestVsockConnect(b *testing.B) { benchConnect(b, false) }

// BenchmarkGuestForwardThroughput: host → guest bulk bytes via 127.0.0.1:<port>.
func BenchmarkGuestForwardThroughput(b *testing.B) { benchThroughput(b, true) }

// BenchmarkGuestVsockThroughput: the same over the hybrid-vsock socket, without the forward.
func BenchmarkGuestVsockThroughput(b *testing.B) { benchThroughput(b, false) }

// copyGuestSrv puts the guest server into a sandbox and runs it once so its pages are in the
// guest's cache (its first start under TCG takes seconds).
func (s *stack) copyGuestSrv(t testing.TB, name string) {
	t.Helper()
	if out, err := s.nexus("cp", s.guestsrv, name+":/tmp/guestsrv"); err != nil {
		t.Fatalf("cp guestsrv to %s: %v: %s", name, err, out)
	}
	s.guest(t, name, "/tmp/guestsrv >/dev/null 2>&1; true")
}
