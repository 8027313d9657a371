package http1

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
)

// Request is one request read from a client. A Request is reused for the connection's next
// request: Read resets it, and its head buffer and fields with it.
type Request struct {
	Head
	Method  string
	Target  string // the request target as sent
	URL     *url.URL
	Minor   int    // HTTP/1.minor
	Host    string // the Host field ("" when absent)
	Framing Framing
	// Body is nil when the request has no body; a caller may wrap it.
	Body io.Reader
	// Chunks is the chunked body (and its trailer) when the body is chunked.
	Chunks *ChunkedBody
	// Close: the client asked for the connection to close after this request.
	Close          bool
	ExpectContinue bool

	upgrade    string // the protocol asked for with Connection: upgrade
	teTrailers bool
}

// Read reads the next request head from br, at most limit bytes (limit again for a chunked
// body's trailer), and sets up its body. io.EOF means the client closed between requests.
func (r *Request) Read(br *bufio.Reader, limit int) error {
	*r = Request{Head: r.Head}
	if err := r.Head.read(br, limit, 4); err != nil {
		return err
	}
	// method SP request-target SP HTTP-version
	method, rest, ok1 := bytes.Cut(r.Start, []byte(" "))
	target, version, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 || len(method) == 0 || len(target) == 0 {
		return malformed("bad request line")
	}
	major, minor, ok := httpVersion(version)
	if !ok {
		return malformed("bad HTTP version")
	}
	if major != 1 {
		return ErrVersion
	}
	for _, c := range method {
		if !isTokenByte(c) {
			return malformed("bad method")
		}
	}
	for _, c := range target {
		if c <= ' ' || c == 0x7f {
			return malformed("bad request target")
		}
	}
	r.Method, r.Target, r.Minor = methodString(method), string(target), minor
	if r.Method == http.MethodConnect {
		r.URL = &url.URL{Host: r.Target}
	} else {
		// origin form (/path?query), absolute form with a host (https://host/path), or * for
		// OPTIONS (RFC 9112 §3.2).
		u, err := url.ParseRequestURI(r.Target)
		switch {
		case err != nil:
			return malformed("bad request target")
		case r.Target == "*" && r.Method != http.MethodOptions,
			r.Target[0] != '/' && r.Target != "*" && (u.Host == "" || u.Scheme != "http" && u.Scheme != "https"):
			return malformed("bad request target")
		}
		r.URL = u
	}
	hosts := 0
	for _, f := range r.Fields {
		switch {
		case f.Is("Host"):
			hosts++
			r.Host = string(f.Value)
		case f.Is("Expect"):
			r.ExpectContinue = minor >= 1 && asciiEqualFold(f.Value, "100-continue")
		case f.Is("Te"):
			r.teTrailers = r.teTrailers || bytes.Contains(bytes.ToLower(f.Value), []byte("trailers"))
		}
	}
	if hosts > 1 {
		return malformed("more than one Host header")
	}
	if r.connection && r.hasToken("Connection", "upgrade") {
		up, _ := r.Get("Upgrade")
		if !printable(up) {
			return malformed("invalid Upgrade protocol")
		}
		r.upgrade = string(up)
	}
	r.Close = r.wantsClose(minor)
	frame, err := r.framing(minor == 0)
	if err != nil {
		return err
	}
	r.Framing = frame
	// A request without a length or chunks has no body (RFC 9112 §6.3).
	if frame.Chunked || frame.Length > 0 {
		r.Body, r.Chunks = frame.body(br, limit)
	}
	return nil
}

// methods are the methods whose names a request gets without an allocation.
var methods = [...]string{
	http.MethodGet, http.MethodPost, http.MethodHead, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions, http.MethodConnect,
}

// methodString is the method as a string, without allocating for the common ones.
func methodString(b []byte) string {
	for _, m := range methods {
		if string(b) == m {
			return m
		}
	}
	return string(b)
}

// HTTPRequest is the request as net/http would have parsed it, its Body the request's (for code
// written against net/http that may read part of the body and put it back: take it back from
// the result). It costs a map and a string per field: build it only for a caller that needs it.
func (r *Request) HTTPRequest() *http.Request {
	hdr := make(http.Header, len(r.Fields))
	for _, f := range r.Fields {
		k := textproto.CanonicalMIMEHeaderKey(string(f.Name))
		hdr[k] = append(hdr[k], string(f.Value))
	}
	delete(hdr, "Host")
	hr := &http.Request{
		Method: r.Method, URL: r.URL, Proto: "HTTP/1." + string(rune('0'+r.Minor)), ProtoMajor: 1, ProtoMinor: r.Minor,
		Header: hdr, Host: r.Host, RequestURI: r.Target, ContentLength: r.Framing.Length, Body: http.NoBody,
	}
	if r.URL.Host != "" {
		hr.Host = r.URL.Host
	}
	if r.Body != nil {
		hr.Body = io.NopCloser(r.Body)
	}
	switch {
	case r.Framing.Chunked:
		hr.ContentLength = -1
	case r.Body == nil:
		hr.ContentLength = 0
	}
	return hr
}

// Response is a server's answer to one request. Like a Request, it is reused for the next.
type Response struct {
	Head
	Status  int
	Reason  []byte
	Minor   int
	Framing Framing
	// NoBody: the answer has no body whatever its fields say (HEAD, 1xx, 204, 304).
	NoBody bool
	// Body is nil when the answer has no body.
	Body   io.Reader
	Chunks *ChunkedBody
	// Close: the server closes the connection after this answer (or its body ends with it).
	Close bool
}

// Read reads the server's final answer to a request of the given method, at most limit bytes of
// head: informational answers other than 101 are skipped.
func (r *Response) Read(br *bufio.Reader, method string, limit int) error {
	for range maxInformational {
		if err := r.readOne(br, method, limit); err != nil {
			return err
		}
		if r.Status >= 200 || r.Status == http.StatusSwitchingProtocols {
			return nil
		}
	}
	return malformed(fmt.Sprintf("more than %d informational answers", maxInformational))
}

// maxInformational bounds the 1xx answers (100 Continue, 103 Early Hints) before the final one.
const maxInformational = 16

func (r *Response) readOne(br *bufio.Reader, method string, limit int) error {
	*r = Response{Head: r.Head}
	if err := r.Head.read(br, limit, 0); err != nil {
		if err == io.EOF {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	// HTTP-version SP status-code SP [reason-phrase]
	version, rest, _ := bytes.Cut(r.Start, []byte(" "))
	code, reason, _ := bytes.Cut(rest, []byte(" "))
	major, minor, ok := httpVersion(version)
	if !ok || major != 1 || len(code) != 3 {
		return malformed("bad status line")
	}
	for _, c := range code {
		if c < '0' || c > '9' {
			return malformed("bad status code")
		}
	}
	for _, c := range reason {
		if !isValueByte(c) {
			return malformed("bad reason phrase")
		}
	}
	r.Status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if r.Status < 100 {
		return malformed("bad status code")
	}
	r.Reason, r.Minor = reason, minor
	r.Close = r.wantsClose(minor)
	r.Framing = NoBody
	r.NoBody = method == http.MethodHead || r.Status < 200 || r.Status == http.StatusNoContent || r.Status == http.StatusNotModified
	if r.NoBody {
		return nil
	}
	frame, err := r.framing(minor == 0)
	if err != nil {
		return err
	}
	r.Framing = frame
	if !frame.Chunked && frame.Length < 0 { // delimited by the end of the connection
		r.Body, r.Close = br, true
		return nil
	}
	r.Body, r.Chunks = frame.body(br, limit)
	return nil
}
