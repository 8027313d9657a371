package mitm

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
)

// request is one request read from the guest.
type request struct {
	head
	method string
	target string // the request target as sent
	url    *url.URL
	minor  int    // HTTP/1.minor
	host   string // the Host field ("" when absent)
	frame  bodyFraming
	body   io.Reader // nil when the request has no body
	chunk  *chunkedBody
	// close: the guest asked for the connection to close after this request.
	close          bool
	expectContinue bool
	upgrade        string // the protocol asked for with Connection: upgrade
	teTrailers     bool

	// Set by judge: the Authorization value sent instead of the guest's, or none at all.
	auth      string
	stripAuth bool
}

// versionError is a request of an HTTP version other than 1.x (HTTP/2's preface).
type versionError struct{}

func (versionError) Error() string { return "not HTTP/1.x" }

// read reads the next request head from br and sets up its body.
func (r *request) read(br *bufio.Reader) error {
	*r = request{head: r.head}
	if err := r.head.read(br, MaxRequestHeaderBytes, 4); err != nil {
		return err
	}
	// method SP request-target SP HTTP-version
	method, rest, ok1 := bytes.Cut(r.start, []byte(" "))
	target, version, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 || len(method) == 0 || len(target) == 0 {
		return malformed("bad request line")
	}
	major, minor, ok := httpVersion(version)
	if !ok {
		return malformed("bad HTTP version")
	}
	if major != 1 {
		return &versionError{}
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
	r.method, r.target, r.minor = methodString(method), string(target), minor
	if r.method == http.MethodConnect {
		r.url = &url.URL{Host: r.target}
	} else {
		// origin form (/path?query), absolute form with a host (https://host/path), or * for
		// OPTIONS (RFC 9112 §3.2).
		u, err := url.ParseRequestURI(r.target)
		switch {
		case err != nil:
			return malformed("bad request target")
		case r.target == "*" && r.method != http.MethodOptions,
			r.target[0] != '/' && r.target != "*" && (u.Host == "" || u.Scheme != "http" && u.Scheme != "https"):
			return malformed("bad request target")
		}
		r.url = u
	}
	hosts := 0
	for _, f := range r.fields {
		switch {
		case f.is("Host"):
			hosts++
			r.host = string(f.value)
		case f.is("Expect"):
			r.expectContinue = minor >= 1 && asciiEqualFold(f.value, "100-continue")
		case f.is("Te"):
			r.teTrailers = r.teTrailers || bytes.Contains(bytes.ToLower(f.value), []byte("trailers"))
		}
	}
	if hosts > 1 {
		return malformed("more than one Host header")
	}
	if r.hasConnection && r.hasToken("Connection", "upgrade") {
		up, _ := r.get("Upgrade")
		if !printable(string(up)) {
			return malformed("invalid Upgrade protocol")
		}
		r.upgrade = string(up)
	}
	r.close = r.wantsClose(minor)
	frame, err := r.messageFraming(minor == 0)
	if err != nil {
		return err
	}
	r.frame = frame
	// A request without a length or chunks has no body (RFC 9112 §6.3).
	if frame.chunked || frame.length > 0 {
		r.body, r.chunk = frame.body(br)
	}
	return nil
}

// methodString is the method as a string, without allocating for the common ones.
func methodString(b []byte) string {
	switch string(b) {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodPost:
		return http.MethodPost
	case http.MethodHead:
		return http.MethodHead
	case http.MethodPut:
		return http.MethodPut
	case http.MethodPatch:
		return http.MethodPatch
	case http.MethodDelete:
		return http.MethodDelete
	case http.MethodOptions:
		return http.MethodOptions
	case http.MethodConnect:
		return http.MethodConnect
	}
	return string(b)
}

// hopField reports whether a field belongs to the guest's connection to the proxy (or to the
// framing the proxy writes itself) and so is not forwarded.
func (h *head) hopField(f field) bool {
	for _, name := range hopHeaders {
		if f.is(name) {
			return true
		}
	}
	if f.is("Content-Length") || f.is("Expect") {
		return true
	}
	return h.hasConnection && h.hasToken("Connection", string(f.name))
}

// httpRequest is the request as net/http would have parsed it, for a request policy (which may
// read part of the body and put it back).
func (r *request) httpRequest() *http.Request {
	hdr := make(http.Header, len(r.fields))
	for _, f := range r.fields {
		k := textproto.CanonicalMIMEHeaderKey(string(f.name))
		hdr[k] = append(hdr[k], string(f.value))
	}
	delete(hdr, "Host")
	hr := &http.Request{
		Method: r.method, URL: r.url, Proto: "HTTP/1." + string(rune('0'+r.minor)), ProtoMajor: 1, ProtoMinor: r.minor,
		Header: hdr, Host: r.host, RequestURI: r.target, ContentLength: r.frame.length, Body: http.NoBody,
	}
	if r.url.Host != "" {
		hr.Host = r.url.Host
	}
	if r.body != nil {
		hr.Body = io.NopCloser(r.body)
	}
	switch {
	case r.frame.chunked:
		hr.ContentLength = -1
	case r.body == nil:
		hr.ContentLength = 0
	}
	return hr
}

// bodyOf is the body a policy left on hr (nil for none).
func bodyOf(hr *http.Request) io.Reader {
	if hr.Body == nil || hr.Body == http.NoBody {
		return nil
	}
	return hr.Body
}

// response is the host's answer to one request.
type response struct {
	head
	status int
	reason []byte
	minor  int
	frame  bodyFraming
	noBody bool
	body   io.Reader // nil when the answer has no body
	chunk  *chunkedBody
	// close: the host closes the connection after this answer (or its body ends with it).
	close bool
}

// read reads the host's final answer to a request of the given method: informational answers
// other than 101 are skipped.
func (r *response) read(br *bufio.Reader, method string) error {
	for range maxInformational {
		if err := r.readOne(br, method); err != nil {
			return err
		}
		if r.status >= 200 || r.status == http.StatusSwitchingProtocols {
			return nil
		}
	}
	return malformed("more than %d informational answers", maxInformational)
}

// maxInformational bounds the 1xx answers (100 Continue, 103 Early Hints) before the final one.
const maxInformational = 16

func (r *response) readOne(br *bufio.Reader, method string) error {
	*r = response{head: r.head}
	if err := r.head.read(br, MaxRequestHeaderBytes, 0); err != nil {
		if err == io.EOF {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	// HTTP-version SP status-code SP [reason-phrase]
	version, rest, _ := bytes.Cut(r.start, []byte(" "))
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
	r.status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if r.status < 100 {
		return malformed("bad status code")
	}
	r.reason, r.minor = reason, minor
	r.close = r.wantsClose(minor)
	r.noBody = method == http.MethodHead || r.status < 200 || r.status == http.StatusNoContent || r.status == http.StatusNotModified
	if r.noBody {
		return nil
	}
	frame, err := r.messageFraming(minor == 0)
	if err != nil {
		return err
	}
	r.frame = frame
	if !frame.chunked && frame.length < 0 { // delimited by the end of the connection
		r.body, r.close = br, true
		return nil
	}
	r.body, r.chunk = frame.body(br)
	return nil
}
