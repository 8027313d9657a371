package mitm

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IniZio/nexus/pkg/audit"
)

// tunnelTo opens an authenticated CONNECT to host:443 and completes the guest's TLS over it.
func (h *harness) tunnelTo(t *testing.T, host string) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	c, resp := h.rawTunnel(t, host+":443", basic(testSandbox, testToken))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT answered %d", resp.StatusCode)
	}
	tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: h.caPool(t)})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	return tc, bufio.NewReader(tc)
}

// TestMalformedRequestsRefused: requests a strict HTTP/1.1 parser rejects (the shapes request
// smuggling is made of) are answered with a one-line reason and never reach the host.
func TestMalformedRequestsRefused(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	for _, c := range []struct {
		name, raw string
		status    int
		reason    string
	}{
		{"folded header", "GET / HTTP/1.1\r\nHost: api.example.com\r\nX-A: 1\r\n  more\r\n\r\n", 400, "folded header line"},
		{"space before colon", "GET / HTTP/1.1\r\nHost : api.example.com\r\n\r\n", 400, "invalid header name"},
		{"control byte in value", "GET / HTTP/1.1\r\nHost: api.example.com\r\nX-A: a\x01b\r\n\r\n", 400, "invalid value of header X-A"},
		{"two Host headers", "GET / HTTP/1.1\r\nHost: api.example.com\r\nHost: evil.example.com\r\n\r\n", 400, "more than one Host header"},
		{"lengths disagree", "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400, "invalid Content-Length"},
		{"signed length", "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: +3\r\n\r\nabc", 400, "invalid Content-Length"},
		{"other transfer coding", "POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 400, "unsupported transfer coding"},
		{"chunked HTTP/1.0", "POST / HTTP/1.0\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "chunked body in an HTTP/1.0 message"},
		{"bad request line", "GET /a b HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 400, "bad HTTP version"},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "only HTTP/1.x"},
		{"placeholder in a bad name", "GET / HTTP/1.1\r\nHost: api.example.com\r\nX " + placeholder + ": 1\r\n\r\n", 400, `invalid header name "X [redacted]"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			tc, br := h.tunnelTo(t, "api.example.com")
			defer tc.Close()
			io.WriteString(tc, c.raw)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.ReadAll(resp.Body)
			if deny := resp.Header.Get(DenyHeader); resp.StatusCode != c.status || !strings.Contains(deny, c.reason) {
				t.Fatalf("answered %d %q, want %d with %q", resp.StatusCode, deny, c.status, c.reason)
			}
			if b, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("the connection stays open after a malformed request (%q %v)", b, err)
			}
		})
	}
	if hits.Load() != 0 {
		t.Fatalf("%d malformed requests reached the host", hits.Load())
	}
	h.waitEvent(t, func(ev audit.Event) bool { return ev.Rule == RuleBadRequest && ev.Status == 505 })
}

// TestChunkedUploadWithTrailers: a chunked request body and its trailer fields reach the host as
// sent; a trailer carrying a placeholder to a host it is not bound to stops the request with
// placeholder_leak.
func TestChunkedUploadWithTrailers(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %q te=%v", b, r.Trailer.Get("X-Digest"), r.TransferEncoding)
	}))
	tc, br := h.tunnelTo(t, "api.example.com")
	io.WriteString(tc, "POST /up HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\nTrailer: X-Digest\r\n\r\n"+
		"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Digest: sha-1\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if want := `hello world "sha-1" te=[chunked]`; string(b) != want {
		t.Fatalf("host saw %s, want %s", b, want)
	}

	tc, br = h.tunnelTo(t, "other.example.com")
	io.WriteString(tc, "POST /up HTTP/1.1\r\nHost: other.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"5\r\nhello\r\n0\r\nX-Token: "+placeholder+"\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 403 || resp.Header.Get(DenyHeader) == "" {
		t.Fatalf("a placeholder in a trailer to an unbound host: %d", resp.StatusCode)
	}
	if ev := h.waitEvent(t, ruleIs(RulePlaceholderLeak)); ev.Host != "other.example.com" {
		t.Fatalf("audit %+v", ev)
	}
}

// TestSecretWithLineBreakNotSent: a stored secret that cannot be a header value (it would split
// the request's head) is never sent; the agent reads why.
func TestSecretWithLineBreakNotSent(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits), func(c *proxyConfig) {
		c.Resolver = ResolverFunc(func(context.Context, string, string, string) (string, error) {
			return "tok\r\nX-Injected: 1", nil
		})
	})
	c := h.client(t, testSandbox, testToken)
	resp, _ := get(t, c, "https://api.example.com/u", map[string]string{"Authorization": "Bearer " + placeholder})
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(resp.Header.Get(DenyHeader), "not a valid header value") {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get(DenyHeader))
	}
	if hits.Load() != 0 {
		t.Fatal("the request was sent with the broken credential")
	}
}

// TestAbsoluteFormTarget: a request line naming the tunnel's own host in absolute form is served
// (the host gets the path); one whose Host field names another host is refused, whichever of
// the two a server behind a shared front end would route by.
func TestAbsoluteFormTarget(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Host, r.RequestURI)
	}))
	tc, br := h.tunnelTo(t, "api.example.com")
	io.WriteString(tc, "GET https://api.example.com/x?y=1 HTTP/1.1\r\nHost: api.example.com\r\n\r\n"+
		"GET https://api.example.com/x HTTP/1.1\r\nHost: other.example.com\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "api.example.com /x?y=1" {
		t.Fatalf("host saw %q", b)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 403 || !strings.Contains(resp.Header.Get(DenyHeader), "Host other.example.com does not match") {
		t.Fatalf("disagreeing Host: %d %q", resp.StatusCode, resp.Header.Get(DenyHeader))
	}
}

// TestAnswerWithoutLength: a host that ends its answer by closing the connection (no length,
// not chunked) has its answer relayed whole, chunked, and the guest's connection serves the
// next request over a new upstream connection.
func TestAnswerWithoutLength(t *testing.T) {
	var n atomic.Int64
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		fmt.Fprintf(brw, "HTTP/1.1 200 Fine\r\nX-N: %d\r\n\r\nall of answer %d", n.Add(1), n.Load())
		brw.Flush()
		c.Close()
	}))
	tc, br := h.tunnelTo(t, "api.example.com")
	for i := 1; i <= 2; i++ {
		io.WriteString(tc, "GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != fmt.Sprintf("all of answer %d", i) || resp.Status != "200 Fine" ||
			len(resp.TransferEncoding) == 0 || resp.Header.Get("X-N") != fmt.Sprint(i) {
			t.Fatalf("request %d: %q %v %q %v", i, resp.Status, resp.TransferEncoding, b, err)
		}
	}
}

// TestIdleTunnelClosed: a tunnel kept busy stays open past IdleTimeout; one left silent is closed
// after it.
func TestIdleTunnelClosed(t *testing.T) {
	var hits atomic.Int64
	idle := 400 * time.Millisecond
	h := newHarness(t, echoAuth(&hits), func(c *proxyConfig) { c.IdleTimeout = idle })
	tc, br := h.tunnelTo(t, "api.example.com")
	var silent time.Time
	for start := time.Now(); time.Since(start) < 3*idle; {
		time.Sleep(idle / 8) // the guest's pause between requests
		io.WriteString(tc, "GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("a busy tunnel was closed after %v: %v", time.Since(start), err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		silent = time.Now()
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("a silent tunnel: %v, want it closed", err)
	}
	// The idle deadline is pushed at most every IdleTimeout/idleSlack: allow for that.
	if d := time.Since(silent); d < idle*3/4 {
		t.Fatalf("closed after %v of silence, well before IdleTimeout %v", d, idle)
	}
}

// TestMalformedAnswer: a host whose answer is not HTTP/1.1 gets the agent a 502 saying so, not
// a garbled relay.
func TestMalformedAnswer(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		io.WriteString(brw, "HTTP/1.1 200 OK\r\nBad Header: x\r\nContent-Length: 2\r\n\r\nok")
		brw.Flush()
		c.Close()
	}))
	c := h.client(t, testSandbox, testToken)
	resp, _ := get(t, c, "https://api.example.com/", nil)
	if deny := resp.Header.Get(DenyHeader); resp.StatusCode != http.StatusBadGateway || !strings.Contains(deny, `not valid HTTP/1.1: invalid header name "Bad Header"`) {
		t.Fatalf("%d %q", resp.StatusCode, deny)
	}
}

// TestExpectContinue: a guest that waits for 100 Continue before sending its body gets it once
// the request is on its way to the host, and its body arrives whole; a refused request gets its
// refusal instead, without a 100 Continue, and the body is never asked for.
func TestExpectContinue(t *testing.T) {
	h := newHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s expect=%q", b, r.Header.Get("Expect"))
	}))
	tc, br := h.tunnelTo(t, "api.example.com")
	io.WriteString(tc, "POST /up HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	interim, err := http.ReadResponse(br, nil)
	if err != nil || interim.StatusCode != http.StatusContinue {
		t.Fatalf("before the body: %v %v", interim, err)
	}
	io.WriteString(tc, "hello")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != `hello expect=""` {
		t.Fatalf("host saw %q", b)
	}

	tc, br = h.tunnelTo(t, "api.example.com")
	io.WriteString(tc, "POST /up HTTP/1.1\r\nHost: other.example.com\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("refused request: %v %v", resp, err)
	}
	io.ReadAll(resp.Body)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after refusing a request whose body never came, the connection stays open (%v)", err)
	}
}
