package mitm

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

func FuzzBasicAuth(f *testing.F) {
	f.Add("Basic " + "cHJvai9zYjE6dG9rZW4=")
	f.Add("basic Og==")
	f.Add("Basic !!!")
	f.Add("Bearer x")
	f.Fuzz(func(t *testing.T, h string) {
		user, pass, ok := basicAuth(h)
		if !ok && (user != "" || pass != "") {
			t.Fatal("failed parse returned values")
		}
	})
}

func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{"API.Example.COM.", "[::1]", "127.0.0.1", "a..b", "evil\r\nx", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := normalizeHost(s)
		if err != nil {
			return
		}
		if strings.ContainsAny(h, "\r\n \t:/") && !strings.Contains(h, ":") {
			t.Fatalf("unsafe host %q", h)
		}
		for _, c := range []byte(h) {
			if c < 0x21 || c > 0x7e {
				t.Fatalf("unprintable host %q", h)
			}
		}
		if h2, err := normalizeHost(h); err != nil || h2 != h {
			t.Fatalf("not idempotent: %q -> %q (%v)", h, h2, err)
		}
	})
}

func FuzzEachHex64(f *testing.F) {
	f.Add("x" + placeholder + "y")
	f.Add(placeholder + placeholder)
	f.Add(strings.Repeat("a", 63))
	f.Fuzz(func(t *testing.T, s string) {
		eachHex64(s, func(tok string) bool {
			if len(tok) != 64 || !strings.Contains(s, tok) {
				t.Fatalf("bad token %q", tok)
			}
			return true
		})
	})
}

func FuzzRequestHost(f *testing.F) {
	f.Add("api.example.com", "", "443")
	f.Add("api.example.com:8443", "api.example.com", "443")
	f.Add("[::1]:443", "", "443")
	f.Fuzz(func(t *testing.T, host, urlHost, port string) {
		h, ok := requestHost(host, urlHost, port)
		if ok && h == "" {
			t.Fatal("ok with empty host")
		}
		if ok && host != "" && urlHost != "" {
			a, _ := requestHost(host, "", port)
			b, _ := requestHost("", urlHost, port)
			if a != b {
				t.Fatalf("Host %q and URL host %q disagree but were taken", host, urlHost)
			}
		}
	})
}

// FuzzRequestHead: whatever request the tunnel's reader accepts, net/http accepts too with the
// same method, target and body framing, and the request as forwarded to the host parses back to
// the same request with the same body.
func FuzzRequestHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"POST /p?q=1 HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\n\r\nabc",
		"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
		"GET http://a/x HTTP/1.0\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var r request
		if err := r.read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
			return
		}
		// RFC 9112 lets a server skip empty lines before the request line; net/http does not.
		hr, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(bytes.TrimLeft(raw, "\r\n"))))
		if err != nil {
			t.Fatalf("accepted what net/http refuses (%v)", err)
		}
		if hr.Method != r.method || hr.RequestURI != r.target || (hr.ContentLength == -1) != r.frame.chunked {
			t.Fatalf("read as %s %s chunked=%v, net/http: %s %s %d", r.method, r.target, r.frame.chunked, hr.Method, hr.RequestURI, hr.ContentLength)
		}
		if r.method == http.MethodConnect {
			return
		}
		var r2 request
		if err := r2.read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
			t.Fatal(err)
		}
		body, bodyErr := []byte(nil), error(nil)
		if r2.body != nil {
			body, bodyErr = io.ReadAll(r2.body)
		}
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		err = writeRequest(bw, &r, &session{addr: "a:443"})
		bw.Flush()
		if (err != nil) != (bodyErr != nil) {
			t.Fatalf("forwarding: %v, reading the body: %v", err, bodyErr)
		}
		if err != nil {
			return // a body cut short is never forwarded as whole
		}
		back, err := http.ReadRequest(bufio.NewReader(&out))
		if err != nil {
			t.Fatalf("forwarded request does not parse: %v\n%q", err, out.String())
		}
		got, err := io.ReadAll(back.Body)
		if err != nil || back.Method != r.method || !bytes.Equal(got, body) {
			t.Fatalf("forwarded %s with body %q (%v), read %s %q", back.Method, got, err, r.method, body)
		}
	})
}

// FuzzResponseHead: whatever answer the tunnel's reader accepts, net/http reads with the same
// status and the same body.
func FuzzResponseHead(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
		"HTTP/1.0 404 Not Found\r\n\r\nbody to the end",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var r response
		if err := r.read(bufio.NewReader(bytes.NewReader(raw)), http.MethodGet); err != nil {
			return
		}
		var body []byte
		var bodyErr error
		if r.body != nil {
			body, bodyErr = io.ReadAll(r.body)
		}
		br := bufio.NewReader(bytes.NewReader(raw))
		var hr *http.Response
		for {
			var err error
			if hr, err = http.ReadResponse(br, &http.Request{Method: http.MethodGet}); err != nil {
				t.Fatalf("accepted what net/http refuses (%v)", err)
			}
			if hr.StatusCode >= 200 || hr.StatusCode == 101 {
				break
			}
		}
		if hr.StatusCode != r.status {
			t.Fatalf("status %d, net/http %d", r.status, hr.StatusCode)
		}
		got, err := io.ReadAll(hr.Body)
		// Refusing a body net/http takes is allowed (the proxy is stricter); the reverse is not.
		if bodyErr == nil && (err != nil || !bytes.Equal(got, body)) {
			t.Fatalf("body %q (%v), net/http %q (%v)", body, bodyErr, got, err)
		}
	})
}
