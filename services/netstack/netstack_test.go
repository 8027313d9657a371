package netstack_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/miekg/dns"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/policy"
	"github.com/IniZio/nexus/services/netstack"
	"github.com/IniZio/nexus/services/netstack/internal/fakeguest"
)

const (
	sandboxID  = "sb-test"
	proxyToken = "tok-5f3a9c2e7d1b"
)

// cdnIPs are what the fake upstream resolver answers for cdn.test: allowed at L4, never dialled.
var cdnIPs = []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")}

// eventLog is an audit.Sink that keeps every event.
type eventLog struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (l *eventLog) Emit(_ context.Context, ev audit.Event) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

func (l *eventLog) all() []audit.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]audit.Event(nil), l.evs...)
}

// waitEvent polls for an event matching want (zero fields are not compared) and returns it.
func (l *eventLog) waitEvent(t *testing.T, want audit.Event) audit.Event {
	t.Helper()
	var found audit.Event
	testutil.WaitFor(t, 5*time.Second, func() error {
		for _, ev := range l.all() {
			if matches(ev, want) {
				found = ev
				return nil
			}
		}
		return fmt.Errorf("no audit event like %+v", want)
	})
	if found.Sandbox != sandboxID || found.Time.IsZero() {
		t.Fatalf("event lacks sandbox or time: %+v", found)
	}
	return found
}

func matches(ev, want audit.Event) bool {
	return (want.Layer == "" || ev.Layer == want.Layer) &&
		(want.Proto == "" || ev.Proto == want.Proto) &&
		(want.Host == "" || ev.Host == want.Host) &&
		(want.IP == "" || ev.IP == want.IP) &&
		(want.Port == 0 || ev.Port == want.Port) &&
		(want.Decision == "" || ev.Decision == want.Decision) &&
		(want.Rule == "" || ev.Rule == want.Rule) &&
		(want.Reason == "" || strings.Contains(ev.Reason, want.Reason))
}

// upstreams are the loopback servers a test network reaches.
type upstreams struct {
	dnsAddr  string // fake upstream resolver
	httpSrv  *httptest.Server
	tlsSrv   *httptest.Server
	connect  *connectServer
	override map[string]string
}

func startUpstreams(t testing.TB) *upstreams {
	t.Helper()
	u := &upstreams{}
	// Upstream resolver: cdn.test has two A records; everything else NXDOMAIN.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if len(r.Question) == 1 && r.Question[0].Qtype == dns.TypeA && (strings.EqualFold(r.Question[0].Name, "cdn.test.") || privateAnswers[strings.ToLower(r.Question[0].Name)] != nil) {
			ips := cdnIPs
			if a := privateAnswers[strings.ToLower(r.Question[0].Name)]; a != nil {
				ips = a
			}
			for _, ip := range ips {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: ip.AsSlice()})
			}
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	u.dnsAddr = pc.LocalAddr().String()

	u.httpSrv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.Host)
	}))
	t.Cleanup(u.httpSrv.Close)
	u.tlsSrv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls hello from %s", r.Host)
	}))
	t.Cleanup(u.tlsSrv.Close)
	u.connect = startConnectServer(t, map[string]string{
		"web.test:443": u.tlsSrv.Listener.Addr().String(),
		"web.test:80":  u.httpSrv.Listener.Addr().String(),
	})
	u.override = map[string]string{
		"api.test": u.httpSrv.Listener.Addr().String(),
		"web.test": u.tlsSrv.Listener.Addr().String(),
	}
	return u
}

// connectServer is a loopback CONNECT proxy standing in for mitm: it records each CONNECT target
// and Proxy-Authorization, then tunnels to a fixed map of targets.
type connectServer struct {
	ln      net.Listener
	targets map[string]string
	mu      sync.Mutex
	seen    []connectSeen
}

type connectSeen struct{ target, auth, dial string }

func startConnectServer(t testing.TB, targets map[string]string) *connectServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &connectServer{ln: ln, targets: targets}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go c.serve(conn)
		}
	}()
	return c
}

func (c *connectServer) serve(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	c.mu.Lock()
	c.seen = append(c.seen, connectSeen{target: req.Host, auth: req.Header.Get("Proxy-Authorization"), dial: req.Header.Get("Nexus-Dial-Addr")})
	c.mu.Unlock()
	dst, ok := c.targets[req.Host]
	if !ok {
		fmt.Fprint(conn, "HTTP/1.1 403 Forbidden\r\n\r\n")
		return
	}
	up, err := net.Dial("tcp", dst)
	if err != nil {
		fmt.Fprint(conn, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer up.Close()
	fmt.Fprint(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
	go func() { _, _ = io.Copy(up, br); up.(*net.TCPConn).CloseWrite() }()
	_, _ = io.Copy(conn, up)
}

func (c *connectServer) seenList() []connectSeen {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]connectSeen(nil), c.seen...)
}

// env is one service with one network and a fake guest attached.
type env struct {
	svc    *netstack.Manager
	log    *eventLog
	up     *upstreams
	guest  *fakeguest.Guest
	sock   string
	ctx    context.Context
	cancel context.CancelFunc
	// requests receives what an ask-mode network holds for approval (ask_test.go).
	requests chan netstackapi.EgressRequest
}

func shortSocket(t testing.TB) string {
	dir, err := os.MkdirTemp("", "nsk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "net.sock")
}

// newEnv starts a network with pol; extra resolver overrides (name → ip[:port]) are added to the
// standard upstreams'.
func newEnv(t testing.TB, pol netstackapi.Policy, extra ...map[string]string) *env {
	t.Helper()
	return newEnvConfig(t, pol, nil, extra...)
}

// newEnvConfig is newEnv with the manager's config changed by tune first.
func newEnvConfig(t testing.TB, pol netstackapi.Policy, tune func(*netstack.ManagerConfig), extra ...map[string]string) *env {
	t.Helper()
	t.Setenv("HOME", t.TempDir())
	t.Setenv("NEXUS_HOME", t.TempDir())
	e := &env{log: &eventLog{}, up: startUpstreams(t), sock: shortSocket(t), requests: make(chan netstackapi.EgressRequest, 16)}
	for _, m := range extra {
		for k, v := range m {
			e.up.override[k] = v
		}
	}
	cfg := netstack.ManagerConfig{
		Logger: zerolog.Nop(),
		Audit:  e.log,
		OnRequest: func(r netstackapi.EgressRequest) {
			select {
			case e.requests <- r:
			default:
			}
		},
		MITMAddr:          e.up.connect.ln.Addr().String(),
		UpstreamDNS:       e.up.dnsAddr,
		ResolverOverrides: e.up.override,
		DialTimeout:       2 * time.Second,
		PeekTimeout:       2 * time.Second,
	}
	if tune != nil {
		tune(&cfg)
	}
	svc, err := netstack.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	t.Cleanup(svc.Close)
	if _, err := svc.CreateNetwork(context.Background(), netstack.Spec{
		SandboxID: sandboxID, SandboxName: "default/test", Policy: pol, SocketPath: e.sock, ProxyToken: proxyToken,
	}); err != nil {
		t.Fatal(err)
	}
	e.ctx, e.cancel = context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(e.cancel)
	e.attach(t)
	return e
}

func (e *env) attach(t testing.TB) {
	t.Helper()
	g, err := fakeguest.Dial(e.ctx, e.sock, fakeguest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.guest = g
	t.Cleanup(func() { g.Close() })
}

func rules(t testing.TB, ss ...string) []policy.Rule {
	rs, err := policy.ParseRules(ss)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func curated(t testing.TB) netstackapi.Policy {
	return netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rules(t, "api.test:8080", "web.test", "cdn.test")}
}

func (e *env) lookup(t testing.TB, name string) netip.Addr {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	ips, err := e.guest.LookupA(ctx, name)
	if err != nil {
		t.Fatalf("guest lookup %s: %v", name, err)
	}
	return ips[0]
}

// httpGet does one HTTP/1.1 GET over a guest connection to dst.
func (e *env) httpGet(t testing.TB, dst netip.AddrPort, host string) (string, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	c, err := e.guest.DialTCP(ctx, dst)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return roundTrip(c, host)
}

func roundTrip(c net.Conn, host string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestAllowedHostByName(t *testing.T) {
	e := newEnv(t, curated(t))
	ip := e.lookup(t, "api.test")
	if !netip.MustParsePrefix("198.18.0.0/15").Contains(ip) {
		t.Fatalf("override answer %s is not synthetic", ip)
	}
	body, err := e.httpGet(t, netip.AddrPortFrom(ip, 8080), "api.test")
	if err != nil || body != "hello from api.test" {
		t.Fatalf("GET api.test:8080 = %q, %v", body, err)
	}
	e.log.waitEvent(t, audit.Event{Layer: "dns", Proto: "udp", Host: "api.test", Decision: "allow", Rule: "api.test:8080", Reason: "answered " + ip.String()})
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Host: "api.test", IP: ip.String(), Port: 8080, Decision: "allow", Rule: "api.test:8080"})

	info, err := e.svc.Show(sandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != "curated" || info.EffectiveMode != "curated" || !info.GuestAttached || len(info.Rules) != 3 {
		t.Fatalf("show: %+v", info)
	}
	if len(info.DNS) != 1 || info.DNS[0].Name != "api.test" || info.DNS[0].IPs[0] != ip.String() || info.DNS[0].TTL != 60 {
		t.Fatalf("show dns table: %+v", info.DNS)
	}
	if info.Counters.Allowed < 2 {
		t.Fatalf("counters: %+v", info.Counters)
	}
}

func TestShimTLSAndHTTP(t *testing.T) {
	e := newEnv(t, curated(t))
	ip := e.lookup(t, "web.test")

	// TLS: the guest's handshake reaches the upstream through CONNECT web.test:443.
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	c, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(ip, 443))
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "web.test", InsecureSkipVerify: true})
	body, err := roundTrip(tc, "web.test")
	tc.Close()
	if err != nil || body != "tls hello from web.test" {
		t.Fatalf("https via shim = %q, %v", body, err)
	}
	// HTTP: Host header → CONNECT web.test:80.
	body, err = e.httpGet(t, netip.AddrPortFrom(ip, 80), "web.test")
	if err != nil || body != "hello from web.test" {
		t.Fatalf("http via shim = %q, %v", body, err)
	}
	wantAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte(sandboxID+":"+proxyToken))
	seen := e.up.connect.seenList()
	if len(seen) != 2 || seen[0].target != "web.test:443" || seen[1].target != "web.test:80" {
		t.Fatalf("connect targets: %+v", seen)
	}
	for _, s := range seen {
		if s.auth != wantAuth {
			t.Fatalf("Proxy-Authorization = %q, want %q", s.auth, wantAuth)
		}
	}
	e.log.waitEvent(t, audit.Event{Layer: "tls", Proto: "tcp", Host: "web.test", IP: ip.String(), Port: 443, Decision: "allow", Rule: "web.test:443,80", Reason: "via mitm"})
	e.log.waitEvent(t, audit.Event{Layer: "http", Proto: "tcp", Host: "web.test", Port: 80, Decision: "allow", Rule: "web.test:443,80"})

	// Exactly one event per connection: no separate l4 event for shimmed connections.
	for _, ev := range e.log.all() {
		if ev.Layer == "l4" && ev.IP == ip.String() {
			t.Fatalf("extra l4 event for a shimmed connection: %+v", ev)
		}
	}
	assertNoSecret(t, e.log.all())
}

func assertNoSecret(t *testing.T, evs []audit.Event) {
	t.Helper()
	b, _ := json.Marshal(evs)
	for _, s := range []string{proxyToken, base64.StdEncoding.EncodeToString([]byte(sandboxID + ":" + proxyToken))} {
		if strings.Contains(string(b), s) {
			t.Fatalf("audit events contain a secret")
		}
	}
}

func TestDenied(t *testing.T) {
	e := newEnv(t, curated(t))
	cdn := e.lookup(t, "cdn.test")
	if cdn != cdnIPs[0] {
		t.Fatalf("cdn.test = %s", cdn)
	}

	t.Run("ip literal nobody resolved", func(t *testing.T) {
		_, err := e.httpGet(t, netip.MustParseAddrPort("203.0.113.99:443"), "x")
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("dial = %v, want connection refused (RST)", err)
		}
		e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", IP: "203.0.113.99", Port: 443, Decision: "deny", Reason: "not resolved from an allowed name"})
	})
	t.Run("name off the list", func(t *testing.T) {
		resp, err := e.guest.Exchange(e.ctx, "udp", netip.MustParseAddrPort("192.168.127.1:53"), "evil.test", dns.TypeA)
		if err != nil || resp.Rcode != dns.RcodeNameError {
			t.Fatalf("evil.test: %v %v", resp, err)
		}
		e.log.waitEvent(t, audit.Event{Layer: "dns", Proto: "udp", Host: "evil.test", Decision: "deny", Reason: "not on the allowlist"})
		resp, err = e.guest.Exchange(e.ctx, "tcp", netip.MustParseAddrPort("192.168.127.1:53"), "evil2.test", dns.TypeA)
		if err != nil || resp.Rcode != dns.RcodeNameError {
			t.Fatalf("evil2.test over tcp: %v %v", resp, err)
		}
		e.log.waitEvent(t, audit.Event{Layer: "dns", Proto: "tcp", Host: "evil2.test", Decision: "deny"})
	})
	t.Run("dns to 8.8.8.8 udp", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(e.ctx, 500*time.Millisecond)
		defer cancel()
		if _, err := e.guest.Exchange(ctx, "udp", netip.MustParseAddrPort("8.8.8.8:53"), "api.test", dns.TypeA); err == nil {
			t.Fatal("dns to 8.8.8.8 over udp answered")
		}
		e.log.waitEvent(t, audit.Event{Layer: "dns", Proto: "udp", IP: "8.8.8.8", Port: 53, Decision: "deny", Reason: "only to the gateway"})
	})
	t.Run("dns to 8.8.8.8 tcp", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
		defer cancel()
		if _, err := e.guest.Exchange(ctx, "tcp", netip.MustParseAddrPort("8.8.8.8:53"), "api.test", dns.TypeA); err == nil {
			t.Fatal("dns to 8.8.8.8 over tcp answered")
		}
		e.log.waitEvent(t, audit.Event{Layer: "dns", Proto: "tcp", IP: "8.8.8.8", Port: 53, Decision: "deny"})
	})
	t.Run("udp to allowed ip on another port", func(t *testing.T) {
		c, err := e.guest.DialUDP(netip.AddrPortFrom(cdn, 443))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("quic?")); err != nil {
			t.Fatal(err)
		}
		e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "udp", Host: "cdn.test", IP: cdn.String(), Port: 443, Decision: "deny"})
	})
	t.Run("icmp", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(e.ctx, 700*time.Millisecond)
		defer cancel()
		if err := e.guest.Ping(ctx, netip.MustParseAddr("203.0.113.99")); !errors.Is(err, fakeguest.ErrNoReply) {
			t.Fatalf("ping to a non-allowed ip: %v, want no reply", err)
		}
		e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "icmp", IP: "203.0.113.99", Decision: "deny"})
		// An allowed IP is answered by the gateway itself (documented).
		ctx2, cancel2 := context.WithTimeout(e.ctx, 3*time.Second)
		defer cancel2()
		if err := e.guest.Ping(ctx2, cdn); err != nil {
			t.Fatalf("ping allowed ip: %v", err)
		}
		e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "icmp", IP: cdn.String(), Host: "cdn.test", Decision: "allow"})
	})
	t.Run("ipv6", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(e.ctx, 700*time.Millisecond)
		defer cancel()
		if c, err := e.guest.DialTCP(ctx, netip.MustParseAddrPort("[2001:db8::1]:443")); err == nil {
			c.Close()
			t.Fatal("ipv6 connection succeeded")
		}
		e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", IP: "2001:db8::1", Port: 443, Decision: "deny", Reason: "IPv4 only"})
		// Allowed names have no AAAA.
		resp, err := e.guest.Exchange(e.ctx, "udp", netip.MustParseAddrPort("192.168.127.1:53"), "cdn.test", dns.TypeAAAA)
		if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
			t.Fatalf("AAAA cdn.test: %v %v", resp, err)
		}
		e.log.waitEvent(t, audit.Event{Layer: "dns", Host: "cdn.test", Reason: "AAAA not answered"})
	})
	t.Run("allowed ip on a non-allowed port", func(t *testing.T) {
		_, err := e.httpGet(t, netip.AddrPortFrom(cdn, 22), "cdn.test")
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("dial = %v, want refused", err)
		}
		e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Host: "cdn.test", IP: cdn.String(), Port: 22, Decision: "deny", Reason: "port 22 is not allowed for cdn.test"})
	})
	t.Run("sni of a non-allowed host to an allowed ip", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		defer cancel()
		c, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(cdn, 443))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tls.Client(c, &tls.Config{ServerName: "evil.test", InsecureSkipVerify: true}).Handshake(); err == nil {
			t.Fatal("handshake with a non-allowed SNI succeeded")
		}
		ev := e.log.waitEvent(t, audit.Event{Layer: "tls", Proto: "tcp", Host: "evil.test", IP: cdn.String(), Port: 443, Decision: "deny", Reason: "sni evil.test is not allowed"})
		if !strings.Contains(ev.Reason, "cdn.test") {
			t.Fatalf("reason should name the resolved host: %q", ev.Reason)
		}
		for _, s := range e.up.connect.seenList() {
			if strings.HasPrefix(s.target, "evil.test") {
				t.Fatal("a non-allowed SNI reached mitm")
			}
		}
	})
	t.Run("host header of a non-allowed host to an allowed ip", func(t *testing.T) {
		if _, err := e.httpGet(t, netip.AddrPortFrom(cdn, 80), "evil.test"); err == nil {
			t.Fatal("http with a non-allowed Host succeeded")
		}
		e.log.waitEvent(t, audit.Event{Layer: "http", Host: "evil.test", Port: 80, Decision: "deny"})
	})
	assertNoSecret(t, e.log.all())
	info, _ := e.svc.Show(sandboxID)
	if info.Counters.Denied < 10 {
		t.Fatalf("denied counter %d", info.Counters.Denied)
	}
}

func TestAllowAllExpires(t *testing.T) {
	e := newEnv(t, netstackapi.Policy{Mode: netstackapi.ModeAllowAll, AllowAllUntil: time.Now().Add(2 * time.Second)})
	ip := e.lookup(t, "api.test") // any name resolves in allow-all
	body, err := e.httpGet(t, netip.AddrPortFrom(ip, 8080), "api.test")
	if err != nil || body != "hello from api.test" {
		t.Fatalf("allow-all GET = %q, %v", body, err)
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Port: 8080, Decision: "allow", Rule: "allow-all"})
	// Poll until the window has passed: connections are then refused and audited.
	testutil.WaitFor(t, 10*time.Second, func() error {
		if _, err := e.httpGet(t, netip.AddrPortFrom(ip, 8080), "api.test"); err == nil {
			return errors.New("still allowed")
		}
		return nil
	})
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Port: 8080, Decision: "deny"})
	resp, err := e.guest.Exchange(e.ctx, "udp", netip.MustParseAddrPort("192.168.127.1:53"), "api.test", dns.TypeA)
	if err != nil || resp.Rcode != dns.RcodeNameError {
		t.Fatalf("dns after expiry: %v %v", resp, err)
	}
	info, _ := e.svc.Show(sandboxID)
	if info.Mode != "allow-all" || info.EffectiveMode != "curated" || info.Expiry.IsZero() {
		t.Fatalf("show after expiry: mode %s effective %s expiry %s", info.Mode, info.EffectiveMode, info.Expiry)
	}
}

func TestModeNone(t *testing.T) {
	e := newEnv(t, netstackapi.Policy{Mode: netstackapi.ModeNone, Allow: rules(t, "api.test:8080")})
	resp, err := e.guest.Exchange(e.ctx, "udp", netip.MustParseAddrPort("192.168.127.1:53"), "api.test", dns.TypeA)
	if err != nil || resp.Rcode != dns.RcodeRefused {
		t.Fatalf("dns in mode none: %v %v", resp, err)
	}
	e.log.waitEvent(t, audit.Event{Layer: "dns", Host: "api.test", Decision: "deny", Reason: "egress mode none"})
	if _, err := e.httpGet(t, netip.MustParseAddrPort("198.18.0.1:8080"), "api.test"); err == nil {
		t.Fatal("tcp left in mode none")
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", IP: "198.18.0.1", Decision: "deny", Reason: "egress mode none"})
	ctx, cancel := context.WithTimeout(e.ctx, 500*time.Millisecond)
	defer cancel()
	if err := e.guest.Ping(ctx, netip.MustParseAddr("198.18.0.1")); err == nil {
		t.Fatal("ping answered in mode none")
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "icmp", Decision: "deny", Reason: "egress mode none"})
	for _, ev := range e.log.all() {
		if ev.Decision == audit.Allow {
			t.Fatalf("allow in mode none: %+v", ev)
		}
	}
}

func TestUpdateChangesDecisionsLive(t *testing.T) {
	e := newEnv(t, curated(t))
	ip := e.lookup(t, "api.test")
	dst := netip.AddrPortFrom(ip, 8080)
	if _, err := e.httpGet(t, dst, "api.test"); err != nil {
		t.Fatalf("before update: %v", err)
	}
	if _, err := e.svc.UpdateNetwork(context.Background(), sandboxID, netstackapi.Policy{Mode: "curated", Allow: rules(t, "web.test")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.httpGet(t, dst, "api.test"); err == nil {
		t.Fatal("allowed after the rule was removed")
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", IP: ip.String(), Port: 8080, Decision: "deny", Reason: "port 8080 is not allowed for api.test"})
	if _, err := e.svc.UpdateNetwork(context.Background(), sandboxID, netstackapi.Policy{Mode: "curated", Allow: rules(t, "api.test:8080")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.httpGet(t, dst, "api.test"); err != nil {
		t.Fatalf("after re-allowing: %v", err)
	}
	if _, err := e.svc.UpdateNetwork(context.Background(), sandboxID, netstackapi.Policy{Mode: "bogus"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad mode: %v", err)
	}
	if _, err := e.svc.UpdateNetwork(context.Background(), "nope", netstackapi.Policy{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown sandbox: %v", err)
	}
}

func TestGuestReconnectAndRemove(t *testing.T) {
	e := newEnv(t, curated(t))
	ip := e.lookup(t, "api.test")
	// QEMU restarts: the old connection goes away, a new one arrives on the same socket.
	e.guest.Close()
	e.attach(t)
	var body string
	testutil.WaitFor(t, 5*time.Second, func() error {
		var err error
		body, err = e.httpGet(t, netip.AddrPortFrom(ip, 8080), "api.test")
		return err
	})
	if body != "hello from api.test" {
		t.Fatalf("after reconnect: %q", body)
	}
	if _, err := e.svc.CreateNetwork(context.Background(), netstack.Spec{SandboxID: sandboxID, SocketPath: shortSocket(t)}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate create: %v", err)
	}
	if err := e.svc.RemoveNetwork(context.Background(), sandboxID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
	if _, err := e.svc.Show(sandboxID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("show after remove: %v", err)
	}
}

func TestDHCP(t *testing.T) {
	e := newEnv(t, curated(t))
	c, err := e.guest.DialUDPFrom(68, netip.MustParseAddrPort("192.168.127.1:67"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	disc, err := dhcpv4.NewDiscovery(mac)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(disc.ToBytes()); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	k, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no dhcp offer: %v", err)
	}
	offer, err := dhcpv4.FromBytes(buf[:k])
	if err != nil {
		t.Fatal(err)
	}
	if offer.MessageType() != dhcpv4.MessageTypeOffer || !offer.YourIPAddr.Equal(net.ParseIP("192.168.127.2")) ||
		len(offer.Router()) != 1 || !offer.Router()[0].Equal(net.ParseIP("192.168.127.1")) ||
		len(offer.DNS()) != 1 || !offer.DNS()[0].Equal(net.ParseIP("192.168.127.1")) {
		t.Fatalf("offer: %s", offer.Summary())
	}
}

// TestConcurrentCreates: many sandboxes starting at once each get their network (a create in
// progress must not trip up the others), and every one can be removed.
func TestConcurrentCreates(t *testing.T) {
	e := newEnv(t, netstackapi.Policy{Mode: netstackapi.ModeCurated})
	const n = 16
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := e.svc.CreateNetwork(context.Background(), netstack.Spec{SandboxID: fmt.Sprintf("sb-par-%d", i), SocketPath: shortSocket(t)})
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent create: %v", err)
		}
	}
	for i := range n {
		if err := e.svc.RemoveNetwork(context.Background(), fmt.Sprintf("sb-par-%d", i)); err != nil {
			t.Fatalf("remove %d: %v", i, err)
		}
	}
	if got := len(e.svc.List()); got != 1 {
		t.Fatalf("%d networks left, want the test's own", got)
	}
}
