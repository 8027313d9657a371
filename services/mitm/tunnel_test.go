package mitm

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/audit"
)

// tlsTunnel opens an authenticated CONNECT to api.example.com:443 and completes the guest's TLS
// handshake over it.
func (h *harness) tlsTunnel(t *testing.T) *tls.Conn {
	t.Helper()
	c, resp := h.rawTunnel(t, "api.example.com:443", basic(testSandbox, testToken))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT answered %d", resp.StatusCode)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "api.example.com", RootCAs: h.caPool(t)})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc
}

// traced sends one request and reports its status, its body and whether it rode a kept
// connection.
func traced(t *testing.T, c *http.Client, method, url string, body io.Reader) (int, string, bool) {
	t.Helper()
	req, _ := http.NewRequest(method, url, body)
	var reused bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
	}))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), reused
}

// TestOversizedRequestHeadRefused: a guest that sends a request head beyond the limit gets 431
// and a closed connection; the host never sees the request and the proxy keeps serving others.
func TestOversizedRequestHeadRefused(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	tc := h.tlsTunnel(t)
	go func() {
		// The proxy may stop reading (and close) before all of it is written.
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: api.example.com\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 8<<20))
	}()
	tc.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatalf("no answer to an 8 MiB header: %v", err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
	if hits.Load() != 0 {
		t.Fatal("the oversized request reached the host")
	}
	if ev := h.waitEvent(t, ruleIs(RuleHeadTooLarge)); ev.Decision != audit.Deny || ev.Status != 431 || ev.Host != "api.example.com" {
		t.Fatalf("audit event %+v", ev)
	}
	c := h.client(t, testSandbox, testToken)
	if resp, body := get(t, c, "https://api.example.com/after", nil); resp.StatusCode != 200 || !strings.HasPrefix(body, "auth=") {
		t.Fatalf("after the refusal: %d %q", resp.StatusCode, body)
	}
}

// TestSlowRequestHeadDropped: a guest that opens a tunnel and dribbles a request head is
// disconnected when the header deadline passes.
func TestSlowRequestHeadDropped(t *testing.T) {
	defer func(d time.Duration) { requestHeaderTimeout = d }(requestHeaderTimeout)
	requestHeaderTimeout = 300 * time.Millisecond
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	tc := h.tlsTunnel(t)
	if _, err := io.WriteString(tc, "GET / HTTP/1.1\r\nHost: api.exa"); err != nil {
		t.Fatal(err)
	}
	tc.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.ReadAll(tc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the proxy kept a stalled request head open for 20 s")
	}
	if hits.Load() != 0 {
		t.Fatal("the partial request reached the host")
	}
}

// closingHost answers every request whole (no Connection: close) and then closes the connection,
// as a host whose idle timeout fires between two requests does. closed receives after each close.
func closingHost(closed chan<- struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		body := "ok " + r.Method
		fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		brw.Flush()
		c.Close()
		closed <- struct{}{}
	})
}

// TestKeptUpstreamClosedByHost: when the host closes the tunnel's kept connection between two
// requests, the next request still gets its answer over a new connection, on the same guest
// connection.
func TestKeptUpstreamClosedByHost(t *testing.T) {
	closed := make(chan struct{}, 16)
	h := newHarness(t, closingHost(closed))
	c := h.client(t, testSandbox, testToken)
	do := func(method string, body io.Reader) (int, string, bool) {
		t.Helper()
		status, b, reused := traced(t, c, method, "https://api.example.com/x", body)
		if status == 200 {
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatal("the host did not close its connection")
			}
		}
		return status, b, reused
	}

	// Sent at once after the close: the GET goes out on the dead connection, finds it closed
	// before any answer, and is sent again on a new one.
	defer func(d time.Duration) { staleCheckAfter = d }(staleCheckAfter)
	staleCheckAfter = time.Hour
	for i := 0; i < 3; i++ {
		status, body, reused := do("GET", nil)
		if status != 200 || body != "ok GET" {
			t.Fatalf("GET %d: %d %q", i, status, body)
		}
		if i > 0 && !reused {
			t.Fatalf("GET %d: the guest's connection was not kept", i)
		}
	}
	// A POST is never sent twice: found dead only after it went out, it is answered 502.
	status, body, _ := do("POST", strings.NewReader("payload"))
	if status != http.StatusBadGateway || !strings.Contains(body, "did not answer") {
		t.Fatalf("POST on a dead kept connection: %d %q", status, body)
	}
	// Checked before use, the closed connection is replaced before the POST goes out.
	staleCheckAfter = 0
	for i := 0; i < 2; i++ {
		status, body, _ := do("POST", strings.NewReader("payload"))
		if status != 200 || body != "ok POST" {
			t.Fatalf("POST %d after the check: %d %q", i, status, body)
		}
	}
}

// TestStreamedAnswerFlushed: an answer of unknown length (server-sent events) reaches the guest
// as the host writes it, not when it ends.
func TestStreamedAnswerFlushed(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: second\n\n")
	}))
	c := h.client(t, testSandbox, testToken)
	resp, err := c.Get("https://api.example.com/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make(chan string, 1)
	br := bufio.NewReader(resp.Body)
	go func() {
		line, _ := br.ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "data: first\n" {
			t.Fatalf("first line %q", line)
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the first event did not reach the guest while the host held the stream open")
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if string(rest) != "\ndata: second\n\n" {
		t.Fatalf("rest %q", rest)
	}
}

// TestOneUpstreamConnectionPerTunnel: each guest connection has its own connection to the host,
// kept across its requests; two guest connections never share one.
func TestOneUpstreamConnectionPerTunnel(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.RemoteAddr]++
		mu.Unlock()
		io.WriteString(w, "ok")
	}))
	for i := 0; i < 2; i++ {
		c := h.client(t, testSandbox, testToken)
		for j := 0; j < 3; j++ {
			if resp, _ := get(t, c, "https://api.example.com/", nil); resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		c.CloseIdleConnections()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("host saw %d connections for 2 guest connections: %v", len(seen), seen)
	}
	for addr, n := range seen {
		if n != 3 {
			t.Fatalf("connection %s carried %d requests, want 3", addr, n)
		}
	}
}

// TestTrailersAndHopHeaders: trailers reach the guest; headers of the guest's hop do not reach
// the host, and the guest's own forwarding headers pass untouched.
func TestTrailersAndHopHeaders(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		fmt.Fprintf(w, "keep-alive=%q x-custom-hop=%q xff=%q ua=%q", r.Header.Get("Keep-Alive"),
			r.Header.Get("X-Custom-Hop"), r.Header.Get("X-Forwarded-For"), r.Header.Get("User-Agent"))
		w.Header().Set("X-Sum", "42")
	}))
	c := h.client(t, testSandbox, testToken)
	req, _ := http.NewRequest("GET", "https://api.example.com/t", nil)
	req.Header.Set("Connection", "X-Custom-Hop")
	req.Header.Set("X-Custom-Hop", "1")
	req.Header.Set("Keep-Alive", "timeout=5")
	req.Header.Set("X-Forwarded-For", "10.0.0.7")
	req.Header.Set("User-Agent", "agent/1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `keep-alive="" x-custom-hop="" xff="10.0.0.7" ua="agent/1"`; string(b) != want {
		t.Fatalf("host saw %s, want %s", b, want)
	}
	if resp.Trailer.Get("X-Sum") != "42" {
		t.Fatalf("trailer %v", resp.Trailer)
	}
}

// TestResolveCachedPerSandbox: a burst of requests with the same placeholder costs one resolve;
// a refusal is asked again each time; a sandbox registered anew starts without the cache.
func TestResolveCachedPerSandbox(t *testing.T) {
	var calls atomic.Int64
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits), func(c *proxyConfig) {
		inner := c.Resolver
		c.Resolver = ResolverFunc(func(ctx context.Context, sb, host, ph string) (string, error) {
			calls.Add(1)
			return inner.Resolve(ctx, sb, host, ph)
		})
	})
	c := h.client(t, testSandbox, testToken)
	auth := map[string]string{"Authorization": "Bearer " + placeholder}
	for i := 0; i < 5; i++ {
		if _, body := get(t, c, "https://api.example.com/u", auth); body != "auth=Bearer "+realToken {
			t.Fatalf("request %d: %q", i, body)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("5 requests cost %d resolves, want 1", n)
	}

	fresh, err := NewSandbox(mitmapi.SandboxPolicy{
		ID: testSandbox, TokenHash: mitmapi.HashHex(testToken), AllowedHosts: []string{"api.example.com"},
		Credentials: []mitmapi.CredentialBinding{{PlaceholderHash: mitmapi.HashHex(placeholder), Hosts: []string{"api.example.com"}}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.reg.Put(fresh)
	c.CloseIdleConnections()
	if _, body := get(t, c, "https://api.example.com/u", auth); body != "auth=Bearer "+realToken {
		t.Fatalf("after re-registration: %q", body)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("a re-registered sandbox used the old cache (%d resolves, want 2)", n)
	}
}

// TestPipelinedHeadAndHTTP10: requests written back to back are answered in order on the same
// connection (a HEAD without a body), and an HTTP/1.0 request gets its answer and the close it
// expects.
func TestPipelinedHeadAndHTTP10(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	tc := h.tlsTunnel(t)
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(tc, "GET /one HTTP/1.1\r\nHost: api.example.com\r\n\r\n"+
		"HEAD /two HTTP/1.1\r\nHost: api.example.com\r\n\r\n"+
		"GET /three HTTP/1.0\r\nHost: api.example.com\r\n\r\n")
	br := bufio.NewReader(tc)
	for _, want := range []struct {
		method string
		body   string
	}{{"GET", "auth="}, {"HEAD", ""}, {"GET", "auth="}} {
		resp, err := http.ReadResponse(br, &http.Request{Method: want.method})
		if err != nil {
			t.Fatalf("%s: %v", want.method, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != want.body {
			t.Fatalf("%s: %d %q", want.method, resp.StatusCode, b)
		}
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the HTTP/1.0 answer the connection stays open (%v)", err)
	}
	if hits.Load() != 3 {
		t.Fatalf("host saw %d requests", hits.Load())
	}
}

// TestConnectInsideTunnelRefused: a tunnel cannot be turned into a tunnel to somewhere else.
func TestConnectInsideTunnelRefused(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	tc := h.tlsTunnel(t)
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(tc, "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(resp.Header.Get(DenyHeader), "CONNECT inside a tunnel") || hits.Load() != 0 {
		t.Fatalf("status %d deny %q hits %d", resp.StatusCode, resp.Header.Get(DenyHeader), hits.Load())
	}
	h.waitEvent(t, ruleIs(RuleBadRequest))
}

// TestKeepAliveAfterBodies: requests with bodies (fixed length and chunked) keep the guest's
// connection for the next request.
func TestKeepAliveAfterBodies(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d", len(b))
	}))
	c := h.client(t, testSandbox, testToken)
	for i, body := range []io.Reader{strings.NewReader("fixed"), io.MultiReader(strings.NewReader("chun"), strings.NewReader("ked!"))} {
		_, b, reused := traced(t, c, "POST", "https://api.example.com/p", body)
		if want := []string{"5", "8"}[i]; b != want {
			t.Fatalf("POST %d: host read %s bytes, want %s", i, b, want)
		}
		if i > 0 && !reused {
			t.Fatalf("POST %d: the guest's connection was closed after a request with a body", i)
		}
	}
}
