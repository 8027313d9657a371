package mitm

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/home"
)

func noOverrides(c *proxyConfig) { c.ResolverOverrides = nil }

// judgedTunnel opens CONNECT host:443 as sb carrying the netstack's judged address, and returns
// the CONNECT's answer and, after a 200, the guest's TLS connection over it.
func (h *harness) judgedTunnel(t *testing.T, sb, token, host, judged string) (*http.Response, *tls.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := fmt.Sprintf("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\nProxy-Authorization: %s\r\n", host, host, basic(sb, token))
	if judged != "" {
		req += mitmapi.DialAddrHeader + ": " + judged + "\r\n"
	}
	if _, err := c.Write([]byte(req + "\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		return resp, nil
	}
	tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: h.caPool(t)})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	return resp, tc
}

func getVia(t *testing.T, tc *tls.Conn, host string) *http.Response {
	t.Helper()
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestDialerRefusesPrivateAddress: the mitm dials the address the netstack judged, and its
// dialer applies the address rule again: a judged address that is private (a canary in a
// namespace, the loopback upstream itself) is refused as private_address and never dialled.
func TestDialerRefusesPrivateAddress(t *testing.T) {
	canary := testutil.NewCanary(t, testutil.CanaryConfig{Addrs: []string{"10.20.0.5/24", "169.254.169.254"}, TCP: []int{443}})
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits), noOverrides)
	for _, judged := range []string{"10.20.0.5:443", "169.254.169.254:443", "[::ffff:10.20.0.5]:443", h.upstream.Listener.Addr().String()} {
		resp, tc := h.judgedTunnel(t, testSandbox, testToken, "api.example.com", judged)
		if tc == nil {
			t.Fatalf("CONNECT with %s answered %d", judged, resp.StatusCode)
		}
		r := getVia(t, tc, "api.example.com")
		if r.StatusCode != http.StatusForbidden || r.Header.Get(DenyHeader) == "" {
			t.Errorf("GET via %s = %d %q, want 403 with a reason", judged, r.StatusCode, r.Header.Get(DenyHeader))
		}
		ev := h.waitEvent(t, ruleIs("private_address"))
		if ev.Decision != audit.Deny || ev.Host != "api.example.com" || ev.Sandbox != testSandbox {
			t.Errorf("audit %+v", ev)
		}
		h.rec.mu.Lock()
		h.rec.evs = nil
		h.rec.mu.Unlock()
	}
	canary.RequireNothingArrived(t)
	if hits.Load() != 0 {
		t.Errorf("the loopback upstream was reached %d times", hits.Load())
	}
}

// TestDialerAllowsNamedPrivate: --allow-private's CIDR (registered with the sandbox) lets the
// mitm dial a private address; a resolver override is the allowance of its own host and address.
func TestDialerAllowsNamedPrivate(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits), func(c *proxyConfig) {
		c.ResolverOverrides = map[string]string{"other.example.com": c.ResolverOverrides["*"]}
	})
	up := h.upstream.Listener.Addr().String()
	sb, err := NewSandbox(mitmapi.SandboxPolicy{ID: "proj/lan", TokenHash: mitmapi.HashHex(testToken),
		AllowedHosts: []string{"api.example.com"}, AllowPrivate: []string{"127.0.0.0/8"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.reg.Put(sb)
	if _, tc := h.judgedTunnel(t, "proj/lan", testToken, "api.example.com", up); tc == nil || getVia(t, tc, "api.example.com").StatusCode != 200 {
		t.Error("--allow-private 127.0.0.0/8 did not reach the loopback upstream")
	}
	if _, tc := h.judgedTunnel(t, testSandbox, testToken, "other.example.com", up); tc == nil || getVia(t, tc, "other.example.com").StatusCode != 200 {
		t.Error("the override's own host and address were refused")
	}
	// The override names other.example.com: it allows nothing for api.example.com.
	if _, tc := h.judgedTunnel(t, testSandbox, testToken, "api.example.com", up); tc == nil || getVia(t, tc, "api.example.com").StatusCode != 403 {
		t.Error("api.example.com reached a loopback address allowed only for other.example.com")
	}
	if hits.Load() != 2 {
		t.Errorf("upstream hits = %d, want 2", hits.Load())
	}
}

// TestConnectNeedsJudgedAddress: without the netstack's judged address (and no override) the
// mitm does not resolve the name itself: the CONNECT is refused, as is an address that is not
// ip:port.
func TestConnectNeedsJudgedAddress(t *testing.T) {
	h := newHarness(t, http.NotFoundHandler(), noOverrides)
	for _, judged := range []string{"", "api.example.com:443", "10.0.0.1", "[fe80::1%eth0]:443"} {
		resp, tc := h.judgedTunnel(t, testSandbox, testToken, "api.example.com", judged)
		if tc != nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("CONNECT with judged %q answered %d, want 400", judged, resp.StatusCode)
		}
	}
	h.waitEvent(t, ruleIs(RuleBadTarget))
}

// TestListenLoopbackOnly: the first start of a fresh home listens on 127.0.0.1 only (an earlier
// build also left a listener on every interface), and a non-loopback --mitm-addr is refused.
func TestListenLoopbackOnly(t *testing.T) {
	nonLoopback := func() map[string]bool {
		ls, err := testutil.Listeners(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, l := range ls {
			if !l.Addr.Addr().IsLoopback() {
				m[l.Network+" "+l.Addr.String()] = true
			}
		}
		return m
	}
	before := nonLoopback()
	s := &Service{cfg: Config{Home: home.Dir(t.TempDir())}}
	ln, err := s.listen()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if a := ln.Addr().(*net.TCPAddr); !a.IP.IsLoopback() {
		t.Errorf("listening on %s", a)
	}
	for l := range nonLoopback() {
		if !before[l] {
			t.Errorf("a fresh home's mitm also listens on %s", l)
		}
	}
	s.cfg.Addr = "0.0.0.0:0"
	if ln, err := s.listen(); err == nil {
		ln.Close()
		t.Error("--mitm-addr 0.0.0.0:0 accepted")
	}
}
