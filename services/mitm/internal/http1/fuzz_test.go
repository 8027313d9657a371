package http1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
)

const limit = 64 << 10

// FuzzRequestHead: whatever request Request.Read accepts, net/http accepts too with the same
// method, target and body framing, and the request as WriteRequest forwards it parses back to
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
		var r Request
		if err := r.Read(bufio.NewReader(bytes.NewReader(raw)), limit); err != nil {
			return
		}
		// RFC 9112 lets a server skip empty lines before the request line; net/http does not.
		hr, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(bytes.TrimLeft(raw, "\r\n"))))
		if err != nil {
			t.Fatalf("accepted what net/http refuses (%v)", err)
		}
		if hr.Method != r.Method || hr.RequestURI != r.Target || (hr.ContentLength == -1) != r.Framing.Chunked {
			t.Fatalf("read as %s %s chunked=%v, net/http: %s %s %d", r.Method, r.Target, r.Framing.Chunked, hr.Method, hr.RequestURI, hr.ContentLength)
		}
		if r.Method == http.MethodConnect {
			return
		}
		var r2 Request
		if err := r2.Read(bufio.NewReader(bytes.NewReader(raw)), limit); err != nil {
			t.Fatal(err)
		}
		body, bodyErr := []byte(nil), error(nil)
		if r2.Body != nil {
			body, bodyErr = io.ReadAll(r2.Body)
		}
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		err = WriteRequest(bw, &r, Rewrite{DefaultHost: "a:443"})
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
		if err != nil || back.Method != r.Method || !bytes.Equal(got, body) {
			t.Fatalf("forwarded %s with body %q (%v), read %s %q", back.Method, got, err, r.Method, body)
		}
	})
}

// FuzzResponseHead: whatever answer Response.Read accepts, net/http reads with the same status
// and the same body.
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
		var r Response
		if err := r.Read(bufio.NewReader(bytes.NewReader(raw)), http.MethodGet, limit); err != nil {
			return
		}
		var body []byte
		var bodyErr error
		if r.Body != nil {
			body, bodyErr = io.ReadAll(r.Body)
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
		if hr.StatusCode != r.Status {
			t.Fatalf("status %d, net/http %d", r.Status, hr.StatusCode)
		}
		got, err := io.ReadAll(hr.Body)
		// Refusing a body net/http takes is allowed (this reader is stricter); the reverse is not.
		if bodyErr == nil && (err != nil || !bytes.Equal(got, body)) {
			t.Fatalf("body %q (%v), net/http %q (%v)", body, bodyErr, got, err)
		}
	})
}
