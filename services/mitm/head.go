package mitm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http/httputil"
	"strconv"
)

// Message heads inside a tunnel. The proxy forwards the fields of a head as their sender wrote
// them, less the hop-by-hop ones, and frames bodies itself, so it reads heads itself: into one
// buffer per tunnel side, checked as strictly as net/http's parser (token names, field-value
// bytes, no line folding, one Host, one length, "chunked" the only transfer coding), without a
// map or a string per field. Measured: net/http's ReadRequest, ReadResponse and re-serialising
// were most of the proxy's cost per request (BENCH.md, BenchmarkMITMWarm).

// maxFields bounds the fields of one head.
const maxFields = 256

// keptHeadBuffer is the largest head buffer a tunnel keeps for its next head.
const keptHeadBuffer = 16 << 10

var errHeadTooLarge = errors.New("message head too large")

// malformedError is a head that is not HTTP/1.x; its text is safe to show the guest and to
// audit: one printable line, anything shaped like a placeholder redacted.
type malformedError struct{ what string }

func (e *malformedError) Error() string { return "malformed HTTP message: " + e.what }

func malformed(format string, args ...any) error {
	return &malformedError{redactHex64(fmt.Sprintf(format, args...))}
}

// field is one header field: name and value as sent (value without surrounding spaces).
type field struct{ name, value []byte }

func (f field) is(name string) bool { return asciiEqualFold(f.name, name) }

// head is a message head read into buf: its start line and its fields, both slices of buf.
type head struct {
	buf    []byte
	lines  [][2]int // start and end (without the line end) of each line in buf
	start  []byte
	fields []field
	// hasConnection: a Connection field is present (its tokens name more hop-by-hop fields).
	hasConnection bool
}

// read reads one head from br: lines up to the empty one that ends it, limit bytes at most. Up
// to skip empty lines before the start line are skipped (RFC 9112 §2.2: a server reading a
// request should). io.EOF means the peer closed before sending anything.
func (h *head) read(br *bufio.Reader, limit, skip int) error {
	if cap(h.buf) > keptHeadBuffer {
		h.buf = nil // one large head does not pin its buffer for the tunnel's life
	}
	h.buf, h.lines, h.fields, h.start, h.hasConnection = h.buf[:0], h.lines[:0], h.fields[:0], nil, false
	for skipped := 0; ; {
		begin := len(h.buf)
		for {
			chunk, err := br.ReadSlice('\n')
			if len(h.buf)+len(chunk) > limit {
				return errHeadTooLarge
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
		if len(h.lines) > maxFields {
			return errHeadTooLarge
		}
		h.lines = append(h.lines, [2]int{begin, end})
	}
	h.start = h.buf[h.lines[0][0]:h.lines[0][1]]
	for _, l := range h.lines[1:] {
		f, err := parseField(h.buf[l[0]:l[1]])
		if err != nil {
			return err
		}
		h.fields = append(h.fields, f)
		h.hasConnection = h.hasConnection || f.is("Connection")
	}
	return nil
}

// wantsClose reports whether the sender closes the connection after this message: it said
// Connection: close, or it speaks HTTP/1.0 and did not say keep-alive.
func (h *head) wantsClose(minor int) bool {
	return h.hasConnection && h.hasToken("Connection", "close") ||
		minor == 0 && !(h.hasConnection && h.hasToken("Connection", "keep-alive"))
}

// parseField splits "name: value" with the checks of RFC 9110 §5: a token name directly followed
// by the colon, a value of visible characters, spaces and tabs, and no obsolete line folding.
func parseField(line []byte) (field, error) {
	if line[0] == ' ' || line[0] == '\t' {
		return field{}, malformed("folded header line")
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		return field{}, malformed("header line without a name")
	}
	name := line[:colon]
	for _, c := range name {
		if !isTokenByte(c) {
			return field{}, malformed("invalid header name %s", safeBytes(name))
		}
	}
	value := trimSpace(line[colon+1:])
	for _, c := range value {
		if !isValueByte(c) {
			return field{}, malformed("invalid value of header %s", name)
		}
	}
	return field{name: name, value: value}, nil
}

// each calls fn with the value of each field named name.
func (h *head) each(name string, fn func(v []byte)) {
	for _, f := range h.fields {
		if f.is(name) {
			fn(f.value)
		}
	}
}

// get is the value of the first field named name.
func (h *head) get(name string) ([]byte, bool) {
	for _, f := range h.fields {
		if f.is(name) {
			return f.value, true
		}
	}
	return nil, false
}

// hasToken reports whether any field named name lists token (comma-separated, any case).
func (h *head) hasToken(name, token string) bool {
	found := false
	h.each(name, func(v []byte) {
		for len(v) > 0 && !found {
			var item []byte
			item, v, _ = bytes.Cut(v, []byte(","))
			found = asciiEqualFold(trimSpace(item), token)
		}
	})
	return found
}

// bodyFraming is how a message delimits its body on the wire: by its length, chunked, or (a
// body relayed to an HTTP/1.0 guest) by closing the connection; none of these for no body.
type bodyFraming struct {
	length  int64 // >= 0: this many bytes; -1: not by length
	chunked bool
	close   bool
}

// noFraming is the framing of a message without a body.
var noFraming = bodyFraming{length: -1}

// messageFraming reads the framing fields of a head (RFC 9112 §6): Transfer-Encoding, which must
// be "chunked" alone, wins over Content-Length; several lengths must agree.
func (h *head) messageFraming(http10 bool) (bodyFraming, error) {
	f := noFraming
	te := 0
	var err error
	for _, fl := range h.fields {
		switch {
		case fl.is("Transfer-Encoding"):
			te++
			if te > 1 || !asciiEqualFold(fl.value, "chunked") {
				return f, malformed("unsupported transfer coding %s", safeBytes(fl.value))
			}
			f.chunked = true
		case fl.is("Content-Length"):
			n, perr := parseLength(fl.value)
			if perr != nil || (f.length >= 0 && n != f.length) {
				err = malformed("invalid Content-Length")
			}
			f.length = n
		}
	}
	if f.chunked {
		if http10 {
			return f, malformed("chunked body in an HTTP/1.0 message")
		}
		return bodyFraming{length: -1, chunked: true}, nil
	}
	return f, err
}

// body is the reader of a body framed by f from br: chunked (its trailer read at the end) or of
// f.length bytes; nil when the length is zero.
func (f bodyFraming) body(br *bufio.Reader) (io.Reader, *chunkedBody) {
	switch {
	case f.chunked:
		c := newChunkedBody(br)
		return c, c
	case f.length > 0:
		return &lengthBody{r: br, left: f.length}, nil
	}
	return nil, nil
}

func parseLength(v []byte) (int64, error) {
	if len(v) == 0 || len(v) > 18 {
		return 0, errors.New("bad length")
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, errors.New("bad length")
		}
		n = n*10 + int64(c-'0')
	}
	return n, nil
}

// httpVersion parses "HTTP/1.0" or "HTTP/1.1" (any single-digit minor of major 1); major is 0
// for anything else that looks like a version.
func httpVersion(v []byte) (major, minor int, ok bool) {
	if len(v) != 8 || string(v[:5]) != "HTTP/" || v[6] != '.' || v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9' {
		return 0, 0, false
	}
	return int(v[5] - '0'), int(v[7] - '0'), true
}

// lengthBody is a body of a known length: a peer that stops early is an error, never a short body.
type lengthBody struct {
	r    *bufio.Reader
	left int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if errors.Is(err, io.EOF) {
		if b.left > 0 {
			return n, io.ErrUnexpectedEOF
		}
		err = nil
	}
	return n, err
}

// chunkedBody decodes a chunked body and then reads its trailer fields into trailer.
type chunkedBody struct {
	r       *bufio.Reader
	cr      io.Reader
	trailer head
	done    bool
	// check, when set, judges the trailer fields before the body is reported whole.
	check func(*head) error
}

func newChunkedBody(r *bufio.Reader) *chunkedBody {
	return &chunkedBody{r: r, cr: httputil.NewChunkedReader(r)}
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.cr.Read(p)
	if errors.Is(err, io.EOF) {
		if terr := b.readTrailer(); terr != nil {
			return n, terr
		}
		if b.check != nil {
			if cerr := b.check(&b.trailer); cerr != nil {
				return n, cerr
			}
		}
		b.done = true
	}
	return n, err
}

// readTrailer reads the fields after the last chunk, up to the empty line.
func (b *chunkedBody) readTrailer() error {
	t := &b.trailer
	t.buf, t.fields = t.buf[:0], t.fields[:0]
	for {
		line, err := b.r.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		if !bytes.HasSuffix(line, []byte("\r\n")) {
			// net/http does not take bare LF line ends after the last chunk: neither does
			// the proxy, so both ends agree where a body ends.
			return malformed("bare LF after the last chunk")
		}
		line = line[:len(line)-2]
		if len(line) == 0 {
			return nil
		}
		if len(t.buf)+len(line) > MaxRequestHeaderBytes || len(t.fields) >= maxFields {
			return errHeadTooLarge
		}
		// Copy: the reader's buffer is reused by the next read. Fields already parsed keep
		// pointing into the old array if append moves buf; nothing writes to that again.
		off := len(t.buf)
		t.buf = append(t.buf, line...)
		f, err := parseField(t.buf[off:])
		if err != nil {
			return err
		}
		t.fields = append(t.fields, f)
	}
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

// safeBytes quotes at most 64 bytes of untrusted input, printable and on one line, with
// anything shaped like a placeholder redacted first (cutting one short would hide it from the
// redaction).
func safeBytes(b []byte) string {
	s := redactHex64(string(b))
	if len(s) > 64 {
		s = s[:64]
	}
	return strconv.QuoteToASCII(s)
}
