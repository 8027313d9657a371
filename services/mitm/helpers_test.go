package mitm

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
)

const (
	testSandbox = "proj/sb1"
	testToken   = "proxy-token-0123456789"
	// realToken is what the broker holds; it must reach the upstream and nothing else.
	realToken = "ghp_REALSECRETTOKEN_do_not_leak_42"
	// placeholder is bound to api.example.com only.
	placeholder = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"
)

// recorder collects audit events.
type recorder struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (r *recorder) Emit(_ context.Context, ev audit.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
}

func (r *recorder) all() []audit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Event(nil), r.evs...)
}

type harness struct {
	proxy    *Proxy
	addr     string
	reg      *Registry
	rec      *recorder
	logs     *testutil.SyncBuffer
	upstream *httptest.Server
	caDir    string
	resolves sync.Map
}

type harnessOpt func(*proxyConfig)

// newHarness starts an upstream TLS server (httptest's certificate covers example.com and
// *.example.com), a proxy resolving every host to it, and registers testSandbox allowing
// api.example.com and other.example.com, with placeholder bound to api.example.com.
func newHarness(t testing.TB, upstream http.Handler, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{rec: &recorder{}, logs: &testutil.SyncBuffer{}, reg: NewRegistry(), caDir: t.TempDir()}
	h.upstream = httptest.NewTLSServer(upstream)
	t.Cleanup(h.upstream.Close)
	cfg := proxyConfig{
		CADir:     h.caDir,
		Sandboxes: h.reg,
		Resolver: ResolverFunc(func(ctx context.Context, sb, host, ph string) (string, error) {
			if (sb == testSandbox && host == "api.example.com" || sb == "bench") && ph == placeholder {
				return realToken, nil
			}
			return "", errdefs.Refused("placeholder not bound")
		}),
		Audit:             h.rec,
		Logger:            zerolog.New(h.logs).Level(zerolog.TraceLevel),
		ExtraRootCAs:      []*x509.Certificate{h.upstream.Certificate()},
		ResolverOverrides: map[string]string{"*": h.upstream.Listener.Addr().String()},
	}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := newProxy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.proxy = p
	sb, err := NewSandbox(mitmapi.SandboxPolicy{
		ID:           testSandbox,
		TokenHash:    mitmapi.HashHex(testToken),
		AllowedHosts: []string{"api.example.com", "other.example.com", "*.bench.example.com"},
		Credentials:  []mitmapi.CredentialBinding{{PlaceholderHash: mitmapi.HashHex(placeholder), Hosts: []string{"api.example.com"}}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.reg.Put(sb)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	t.Cleanup(func() {
		p.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

func (h *harness) caPool(t testing.TB) *x509.CertPool {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(h.proxy.CACertPEM()) {
		t.Fatal("CA PEM does not parse")
	}
	return pool
}

// client goes through the proxy as the given identity, trusting only the proxy's CA.
func (h *harness) client(t testing.TB, user, token string) *http.Client {
	u := &url.URL{Scheme: "http", Host: h.addr, User: url.UserPassword(user, token)}
	return &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyURL(u),
		TLSClientConfig:     &tls.Config{RootCAs: h.caPool(t)},
		MaxIdleConnsPerHost: 16,
		DisableCompression:  true,
	}, Timeout: 60 * time.Second}
}

// rawTunnel opens CONNECT target through the proxy and returns the connection after a 200.
func (h *harness) rawTunnel(t testing.TB, target, auth string) (net.Conn, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target)
	if auth != "" {
		req += "Proxy-Authorization: " + auth + "\r\n"
	}
	if _, err := c.Write([]byte(req + "\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, resp
}

func (h *harness) events(pred func(audit.Event) bool) []audit.Event {
	var out []audit.Event
	for _, ev := range h.rec.all() {
		if pred(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// waitEvent waits for one event matching pred and returns it.
func (h *harness) waitEvent(t testing.TB, pred func(audit.Event) bool) audit.Event {
	t.Helper()
	var got audit.Event
	testutil.WaitFor(t, 5*time.Second, func() error {
		evs := h.events(pred)
		if len(evs) == 0 {
			b, _ := json.Marshal(h.rec.all())
			return fmt.Errorf("no matching audit event; have %s", b)
		}
		got = evs[len(evs)-1]
		return nil
	})
	return got
}

func basic(user, pass string) string {
	r, _ := http.NewRequest("GET", "/", nil)
	r.SetBasicAuth(user, pass)
	return r.Header.Get("Authorization")
}

func hostIs(host string) func(audit.Event) bool {
	return func(ev audit.Event) bool { return ev.Host == host && ev.Layer == audit.LayerHTTP }
}

func ruleIs(rule string) func(audit.Event) bool {
	return func(ev audit.Event) bool { return ev.Rule == rule }
}
