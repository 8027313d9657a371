// Package http1 reads and writes HTTP/1.1 messages for a proxy that forwards them as their
// senders wrote them (RFC 9110, RFC 9112).
//
// A head is read into one buffer that its Request or Response keeps for the next message of the
// connection, and checked as strictly as net/http's parser: token field names, field-value
// bytes, no obsolete line folding, one Host, agreeing Content-Length values, "chunked" the only
// transfer coding. No map and no string is made per field. Bodies are framed by their length or
// by chunks, the chunked trailer read when the body ends. The writers put a head back on the wire
// less the fields of the sender's hop, with the framing the caller chose for the body it sends.
// A message that is not HTTP/1.x is an *Error; the fuzz targets hold every message the readers
// accept, and the message the writers make of it, against net/http's reading of the same bytes.
//
// Measured: net/http's ReadRequest, ReadResponse and re-serialising were most of the mitm's cost
// per request (BENCH.md, BenchmarkMITMWarm); this package is why they are not.
//
// The package knows nothing of who may send what: it reads, checks and writes heads and body
// framing. An Error may quote bytes the peer sent; a caller that shows one redacts it first.
package http1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
)

// MaxFields bounds the fields of one head (and of one trailer).
const MaxFields = 256

// keptHeadBuffer is the largest head buffer a message keeps for the connection's next head.
const keptHeadBuffer = 16 << 10

// ErrHeadTooLarge is a head (or a trailer) over the caller's byte limit or over MaxFields.
var ErrHeadTooLarge = errors.New("message head too large")

// ErrVersion is a request of an HTTP version other than 1.x (HTTP/2's preface).
var ErrVersion = errors.New("not HTTP/1.x")

// Error is a message that is not HTTP/1.x. Reason says what is wrong in fixed text; Name is the
// field it is about, Value the offending bytes: copies of what the peer sent, never shortened,
// so that a caller can redact what it must before it clips them for display.
type Error struct {
	Reason string
	Name   string
	Value  []byte
}

func (e *Error) Error() string {
	s := "malformed HTTP message: " + e.Reason
	if e.Name != "" {
		s += " " + e.Name
	}
	if e.Value != nil {
		s += " " + strconv.QuoteToASCII(string(e.Value))
	}
	return s
}

func malformed(reason string) error { return &Error{Reason: reason} }

// Field is one header field: name and value as sent (the value without surrounding spaces).
type Field struct{ Name, Value []byte }

// Is reports whether the field is named name (any case).
func (f Field) Is(name string) bool { return asciiEqualFold(f.Name, name) }

// Head is a message head: its start line and its fields, slices of a buffer that the next read
// reuses.
type Head struct {
	Start  []byte
	Fields []Field

	buf   []byte
	lines [][2]int // start and end (without the line end) of each line in buf
	// connection: a Connection field is present (its tokens name more hop-by-hop fields).
	connection bool
}

// read reads one head from br: lines up to the empty one that ends it, limit bytes at most. Up
// to skip empty lines before the start line are skipped (RFC 9112 §2.2: a server reading a
// request should). io.EOF means the peer closed before sending anything.
func (h *Head) read(br *bufio.Reader, limit, skip int) error {
	if cap(h.buf) > keptHeadBuffer {
		h.buf = nil // one large head does not pin its buffer for the connection's life
	}
	h.buf, h.lines, h.Fields, h.Start, h.connection = h.buf[:0], h.lines[:0], h.Fields[:0], nil, false
	for skipped := 0; ; {
		begin := len(h.buf)
		for {
			chunk, err := br.ReadSlice('\n')
			if len(h.buf)+len(chunk) > limit {
				return ErrHeadTooLarge
			}
			h.buf = append(h.buf, chunk...)
			if err == nil {
				break
			}
			if err != bufio.ErrBufferFull {
				if len(h.buf) == 0 && errors.Is(err, io.EOF) {
					return io.EOF
				}
				if errors.Is(err, io.EOF) {
					return io.ErrUnexpectedEOF
				}
				return err
			}
		}
		end := len(h.buf) - 1 // the '\n'
		if end > begin && h.buf[end-1] == '\r' {
			end--
		}
		if end == begin { // an empty line
			if len(h.lines) > 0 {
				break
			}
			if skipped++; skipped > skip {
				return malformed("empty lines instead of a start line")
			}
			continue
		}
		if len(h.lines) > MaxFields {
			return ErrHeadTooLarge
		}
		h.lines = append(h.lines, [2]int{begin, end})
	}
	h.Start = h.buf[h.lines[0][0]:h.lines[0][1]]
	for _, l := range h.lines[1:] {
		f, err := parseField(h.buf[l[0]:l[1]])
		if err != nil {
			return err
		}
		h.Fields = append(h.Fields, f)
		h.connection = h.connection || f.Is("Connection")
	}
	return nil
}

// wantsClose reports whether the sender closes the connection after this message: it said
// Connection: close, or it speaks HTTP/1.0 and did not say keep-alive.
func (h *Head) wantsClose(minor int) bool {
	return h.connection && h.hasToken("Connection", "close") ||
		minor == 0 && !(h.connection && h.hasToken("Connection", "keep-alive"))
}

// parseField splits "name: value" with the checks of RFC 9110 §5: a token name directly followed
// by the colon, a value of visible characters, spaces and tabs, and no obsolete line folding.
func parseField(line []byte) (Field, error) {
	if line[0] == ' ' || line[0] == '\t' {
		return Field{}, malformed("folded header line")
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		return Field{}, malformed("header line without a name")
	}
	name := line[:colon]
	for _, c := range name {
		if !isTokenByte(c) {
			return Field{}, &Error{Reason: "invalid header name", Value: bytes.Clone(name)}
		}
	}
	value := trimSpace(line[colon+1:])
	for _, c := range value {
		if !isValueByte(c) {
			return Field{}, &Error{Reason: "invalid value of header", Name: string(name)}
		}
	}
	return Field{Name: name, Value: value}, nil
}

// Get is the value of the first field named name.
func (h *Head) Get(name string) ([]byte, bool) {
	for _, f := range h.Fields {
		if f.Is(name) {
			return f.Value, true
		}
	}
	return nil, false
}

// hasToken reports whether any field named name lists token (comma-separated, any case).
func (h *Head) hasToken(name, token string) bool {
	for _, f := range h.Fields {
		if !f.Is(name) {
			continue
		}
		for v := f.Value; len(v) > 0; {
			var item []byte
			item, v, _ = bytes.Cut(v, []byte(","))
			if asciiEqualFold(trimSpace(item), token) {
				return true
			}
		}
	}
	return false
}

// hopHeaders are the fields of one connection, never forwarded (RFC 9110 §7.6.1).
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// hopField reports whether a field belongs to the sender's connection to the proxy (or to the
// framing the proxy writes itself) and so is not forwarded.
func (h *Head) hopField(f Field) bool {
	for _, name := range hopHeaders {
		if f.Is(name) {
			return true
		}
	}
	if f.Is("Content-Length") || f.Is("Expect") {
		return true
	}
	return h.connection && h.hasToken("Connection", string(f.Name))
}

// httpVersion parses "HTTP/1.0" or "HTTP/1.1" (any single-digit minor of major 1); major is 0
// for anything else that looks like a version.
func httpVersion(v []byte) (major, minor int, ok bool) {
	if len(v) != 8 || string(v[:5]) != "HTTP/" || v[6] != '.' || v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9' {
		return 0, 0, false
	}
	return int(v[5] - '0'), int(v[7] - '0'), true
}

func isTokenByte(c byte) bool {
	return c < 0x80 && tokenTable[c]
}

var tokenTable = func() (t [128]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-32] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// isValueByte: visible characters, space, tab and obs-text.
func isValueByte(c byte) bool { return c >= 0x20 && c != 0x7f || c == '\t' }

// ValidFieldValue reports whether s may be sent as a field value: visible characters, spaces
// and tabs only, so that it cannot split the head it is written into.
func ValidFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isValueByte(s[i]) {
			return false
		}
	}
	return true
}

// printable: a token fit to put back on the wire (an Upgrade protocol).
func printable(s []byte) bool {
	for _, c := range s {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// asciiEqualFold compares b with s ignoring ASCII case, without allocating.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := b[i], s[i]
		if x|0x20 != y|0x20 || (x|0x20 < 'a' || x|0x20 > 'z') && x != y {
			return false
		}
	}
	return true
}
