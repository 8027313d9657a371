package mitm

import (
	"bytes"
	"io"
	"net/http"
	"sync"
)

// Placeholder detection (DESIGN §5, Credentials). A placeholder is looked for in every part of a
// request a guest writes: each field's name and value, the request target (path and query), the
// body and the trailer fields, and in each of them in the forms a client or an encoder puts it:
//
//   - raw: 64 hex digits in any case, also inside a longer run of hex digits;
//   - percent-encoded (%XX, any case of hex digits, all or only some of the digits encoded, and
//     once more encoded: %2530) and JSON-escaped (\u0030, and "\/" for the slash of base64);
//   - base64, standard or URL alphabet, padded or not, at each of the three byte alignments the
//     placeholder can have in the encoded data (Basic credentials, user:placeholder, included).
//
// The mitm knows a sandbox's placeholders only by their SHA-256, so the scan is a cheap
// prefilter followed by a hash: decode what needs decoding, find every run of at least 64 hex
// digits, hash each 64-digit window of it. Most traffic has no such run, and the prefilter is one
// table lookup per byte (two where base64-shaped runs are long enough to hold a placeholder).
//
// Bounds. The body is scanned whole, however long: no byte of it is forwarded unscanned. A body
// of known length up to wholeBodyMax is read and scanned before its request leaves (a refusal
// sends nothing upstream). Past that, memory is bounded instead of length: the body is read
// through a window that holds back at most maxFormLen bytes between reads (the tail that may
// begin an encoded placeholder continued by the next read), so a placeholder split across reads
// or chunks is found before any of it is sent. Time is bounded per request: hex runs longer than 64 digits have their first and
// last windows hashed always and their inner windows only within longRunBudget hashes per
// request (a placeholder padded on both sides inside a run of tens of thousands of hex digits is
// past it); past the budget the rest of the request is still scanned for every other form.

const (
	// b64Form is the length of a placeholder in base64 without padding (64 bytes: 86 characters).
	b64Form = 86
	// b64Span is how many base64 characters carry a placeholder's bits at the worst of the
	// three alignments: 64 bytes touch at most 22 groups of three.
	b64Span = 88
	// maxFormLen is the longest form the scanner decodes: each of those characters written as
	// a JSON \u00XX escape. A body's read window holds back at most this many bytes.
	maxFormLen = 6 * b64Span
	// longRunBudget bounds the inner windows of long hex runs hashed per request (about 8 ms of
	// SHA-256 on a slow core).
	longRunBudget = 1 << 14
)

// Byte classes of the prefilter.
const (
	classHex = 1 << iota // 0-9 a-f A-F
	classB64             // A-Z a-z 0-9 + / - _ (both base64 alphabets)
	classEsc             // % \ : may start an escape
	// classHold: bytes that may be part of an encoded placeholder still being sent; a body's
	// read window holds back a trailing run of them.
	classHold
)

var byteClass, b64Value = func() (c [256]uint8, v [256]uint8) {
	for i := range v {
		v[i] = 0xff
	}
	set := func(from, to byte, class uint8, val uint8) {
		for b := from; ; b++ {
			c[b] |= class | classHold
			if class&classB64 != 0 {
				v[b] = val + (b - from)
			}
			if b == to {
				return
			}
		}
	}
	set('A', 'Z', classB64, 0)
	set('a', 'z', classB64, 26)
	set('0', '9', classB64|classHex, 52)
	set('a', 'f', classHex, 0)
	set('A', 'F', classHex, 0)
	set('+', '+', classB64, 62)
	set('-', '-', classB64, 62)
	set('/', '/', classB64, 63)
	set('_', '_', classB64, 63)
	set('%', '%', classEsc, 0)
	set('\\', '\\', classEsc, 0)
	set('=', '=', 0, 0) // base64 padding: part of a form being sent
	return c, v
}()

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// scratch holds the decoded copies one scan makes.
type scratch struct{ norm, norm2, dec []byte }

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// forms finds candidate placeholders in the forms the scanner knows. One forms serves one
// request (its budget is the request's).
type forms struct {
	// spent counts the inner windows of long hex runs hashed so far.
	spent int
}

// each calls fn with every 64-hex-digit window found in b, raw or decoded, until fn returns
// false; it reports whether fn never did.
func (f *forms) each(b []byte, fn func(tok []byte) bool) bool {
	if len(b) < placeholderLen {
		return true
	}
	var s *scratch
	defer func() {
		if s != nil {
			scratchPool.Put(s)
		}
	}()
	if !f.plain(b, &s, fn) {
		return false
	}
	// Then with the escapes decoded, twice at most (a %25 encodes the % of another escape): what
	// a receiver that decodes them reads. The bytes as sent were looked at first, because a
	// decoding can also hide a raw placeholder ("%" + "0a..." is a line break and "..." here).
	if bytes.IndexByte(b, '%') < 0 && bytes.IndexByte(b, '\\') < 0 {
		return true
	}
	if s == nil {
		s = scratchPool.Get().(*scratch)
	}
	var changed bool
	if s.norm, changed = unescape(s.norm[:0], b); !changed {
		return true
	}
	if !f.plain(s.norm, &s, fn) {
		return false
	}
	if bytes.IndexByte(s.norm, '%') < 0 && bytes.IndexByte(s.norm, '\\') < 0 {
		return true
	}
	if s.norm2, changed = unescape(s.norm2[:0], s.norm); !changed {
		return true
	}
	return f.plain(s.norm2, &s, fn)
}

// plain looks at b as it is: its hex runs, and its base64 runs long enough to hold a placeholder
// decoded at each of the four character offsets (one of them is the encoder's). Hex digits are
// base64 characters too, so one pass finds both.
func (f *forms) plain(b []byte, s **scratch, fn func(tok []byte) bool) bool {
	return longRuns(b, classB64, placeholderLen, func(i, j int) bool {
		if !f.hexRuns(b[i:j], fn) {
			return false
		}
		if j-i < b64Form {
			return true
		}
		for off := 0; off < 4; off++ {
			if !f.b64Stretches(b[i+off:j], s, fn) {
				return false
			}
		}
		return true
	})
}

// b64Stretches decodes the parts of the base64 characters b (taken from their first as the
// start of a group of four) that can hold hex digits and looks for hex runs in them. The first
// character of a group carries the top six bits of a byte, which for a hex digit is one of
// seven values: only a stretch of at least minHexGroups groups all led by one of those can
// hold a placeholder (64 bytes fill 20 groups whole at any alignment), so random base64 is
// almost never decoded.
func (f *forms) b64Stretches(b []byte, s **scratch, fn func(tok []byte) bool) bool {
	const minHexGroups = 20
	groups := len(b) / 4
	// As in longRuns: the group minHexGroups-1 ahead is looked at first, so random base64 costs
	// about one lookup per twenty groups. No stretch crosses g from the left.
	for g := 0; g+minHexGroups <= groups; {
		k := g + minHexGroups - 1
		if !hexLead[b[4*k]] {
			g = k + 1
			continue
		}
		start, end := k, k+1
		for start > g && hexLead[b[4*(start-1)]] {
			start--
		}
		for end < groups && hexLead[b[4*end]] {
			end++
		}
		if end-start >= minHexGroups {
			// One group more on each side: the placeholder's first and last bytes may share a
			// group with bytes that are not hex digits.
			from, to := 4*max(start-1, 0), min(4*(end+1), len(b))
			if *s == nil {
				*s = scratchPool.Get().(*scratch)
			}
			(*s).dec = decodeB64((*s).dec[:0], b[from:to])
			if !f.hexRuns((*s).dec, fn) {
				return false
			}
		}
		g = end
	}
	return true
}

// hexLead marks the base64 characters that can lead a group whose first byte is a hex digit.
var hexLead = func() (t [256]bool) {
	const alphabets = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for _, h := range []byte("0123456789abcdefABCDEF") {
		t[alphabets[h>>2]] = true
	}
	return t
}()

// hexRuns calls fn with the windows of each run of at least 64 hex digits in b: a run of
// exactly 64 is one window; a longer one has its first and last windows tried always and its
// inner ones within the request's budget.
func (f *forms) hexRuns(b []byte, fn func(tok []byte) bool) bool {
	return longRuns(b, classHex, placeholderLen, func(i, j int) bool {
		if !fn(b[i : i+placeholderLen]) {
			return false
		}
		if j-i > placeholderLen && !fn(b[j-placeholderLen:j]) {
			return false
		}
		for k := i + 1; k < j-placeholderLen && f.spent < longRunBudget; k++ {
			f.spent++
			if !fn(b[k : k+placeholderLen]) {
				return false
			}
		}
		return true
	})
}

// longRuns calls fn with the bounds of each run of bytes of class c at least min long, until fn
// returns false; it reports whether fn never did. It looks at the byte min-1 ahead first: when
// that one is not of the class no such run starts before it, so text of short words costs about
// one lookup per min bytes.
func longRuns(b []byte, c uint8, min int, fn func(i, j int) bool) bool {
	// No run of the class crosses i from the left: i is 0 or follows a byte not of the class.
	for i := 0; i+min <= len(b); {
		k := i + min - 1
		if byteClass[b[k]]&c == 0 {
			i = k + 1
			continue
		}
		start, end := k, k+1
		for start > i && byteClass[b[start-1]]&c != 0 {
			start--
		}
		for end < len(b) && byteClass[b[end]]&c != 0 {
			end++
		}
		if end-start >= min && !fn(start, end) {
			return false
		}
		i = end
	}
	return true
}

// unescape appends b to dst with its percent escapes (%XX), JSON \u escapes of ASCII and JSON's
// escaped slash decoded; other bytes, and escapes that are not well formed, are copied. It
// reports whether anything was decoded.
func unescape(dst, b []byte) ([]byte, bool) {
	changed := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '%' && i+2 < len(b):
			hi, ok1 := unhex(b[i+1])
			lo, ok2 := unhex(b[i+2])
			if ok1 && ok2 {
				dst = append(dst, hi<<4|lo)
				i += 2
				changed = true
				continue
			}
		case c == '\\' && i+1 < len(b) && b[i+1] == '/':
			dst = append(dst, '/')
			i++
			changed = true
			continue
		case c == '\\' && i+5 < len(b) && (b[i+1] == 'u' || b[i+1] == 'U'):
			var v byte
			ok := true
			for _, h := range b[i+2 : i+6] {
				d, isHex := unhex(h)
				ok = ok && isHex
				v = v<<4 | d
			}
			if ok && b[i+2] == '0' && b[i+3] == '0' && v < 0x80 {
				dst = append(dst, v)
				i += 5
				changed = true
				continue
			}
		}
		dst = append(dst, c)
	}
	return dst, changed
}

// decodeB64 appends the bytes the base64 characters b stand for (either alphabet; a last group
// of two or three characters gives one or two bytes).
func decodeB64(dst, b []byte) []byte {
	for len(b) >= 4 {
		v := uint32(b64Value[b[0]])<<18 | uint32(b64Value[b[1]])<<12 | uint32(b64Value[b[2]])<<6 | uint32(b64Value[b[3]])
		dst = append(dst, byte(v>>16), byte(v>>8), byte(v))
		b = b[4:]
	}
	switch len(b) {
	case 2:
		dst = append(dst, b64Value[b[0]]<<2|b64Value[b[1]]>>4)
	case 3:
		v := uint32(b64Value[b[0]])<<18 | uint32(b64Value[b[1]])<<12 | uint32(b64Value[b[2]])<<6
		dst = append(dst, byte(v>>16), byte(v>>8))
	}
	return dst
}

// wholeBodyMax is the longest body read and scanned whole before its request is sent: the
// common API request, refused before any of it leaves. A longer or chunked body is scanned as
// it streams (bodyScan): its head has gone upstream by the time a placeholder is found in it,
// and the request is cut short there, before any byte of the placeholder.
const wholeBodyMax = 64 << 10

// scanBody has the request's body scanned: read and scanned whole now when it is short and of a
// known length (a refusal is the verdict), else as it is forwarded.
func (rs *reqState) scanBody(cleartext bool) *verdict {
	req, sb, host := rs.req, rs.sess.sb, rs.sess.host
	if req.Framing.Chunked || req.Framing.Length > wholeBodyMax {
		rs.body = newBodyScan(req.Body, sb, host, cleartext, &rs.forms)
		req.Body = rs.body
		return nil
	}
	b := make([]byte, req.Framing.Length)
	if _, err := io.ReadFull(req.Body, b); err != nil {
		return &verdict{status: http.StatusBadRequest, rule: RuleBadRequest,
			reason: "nexus: refused: the request body ended before its declared length"}
	}
	if rule := rs.forms.refusal(b, sb, host, cleartext); rule != "" {
		return placeholderVerdict(rule, host)
	}
	req.Body = bytes.NewReader(b)
	return nil
}

// sighting is what a scan makes of one placeholder of the sandbox found in a request.
type sighting int

const (
	sightNone    sighting = iota
	sightBound            // bound to the request's host
	sightForeign          // bound to other hosts only (or to none)
)

// sight looks tok up among sb's placeholders.
func sight(sb *Sandbox, host string, tok []byte) sighting {
	hosts, ok := sb.placeholderBytes(tok)
	switch {
	case !ok:
		return sightNone
	case hosts.Match(host):
		return sightBound
	}
	return sightForeign
}

// refusal scans b for sb's placeholders and returns the rule of the first that may not pass
// (placeholderRule), "" when none.
func (f *forms) refusal(b []byte, sb *Sandbox, host string, cleartext bool) string {
	rule := ""
	f.each(b, func(tok []byte) bool {
		rule = placeholderRule(sight(sb, host, tok), cleartext)
		return rule == ""
	})
	return rule
}

// placeholderError stops a request whose body or trailer fields carry a placeholder they may
// not; its rule names the refusal (placeholder_leak or placeholder_cleartext).
type placeholderError struct{ rule string }

func (e *placeholderError) Error() string {
	return "mitm: refused: a placeholder in the request body (" + e.rule + ")"
}

// placeholderRule is the refusal of a placeholder seen in a request, "" when it may pass: any
// placeholder on a cleartext upstream leg, one bound elsewhere on a TLS one.
func placeholderRule(s sighting, cleartext bool) string {
	switch {
	case s == sightNone:
		return ""
	case cleartext:
		return RulePlaceholderCleartext
	case s == sightForeign:
		return RulePlaceholderLeak
	}
	return ""
}

// bodyScan reads a request body through the scanner: bytes are handed on only once no
// placeholder that may not pass can be among them. Each read is scanned together with the tail
// held back from the read before (the trailing bytes that may begin an encoded placeholder, at
// most maxFormLen), so a placeholder split across reads is found whole. A refusal is the
// body's error (a *placeholderError): whatever the upstream got of the body so far holds no
// part of that placeholder, and the request is cut short there.
type bodyScan struct {
	r         io.Reader
	sb        *Sandbox
	host      string
	cleartext bool
	forms     *forms

	buf   *[]byte // read window: the held-back tail, then the new bytes
	tail  int     // where the held-back tail starts in buf
	held  int     // its length
	ready []byte  // scanned bytes not yet handed on (before the tail in buf)
	err   error
}

// bodyWindow is the size of a body's read window beyond the held-back tail.
const bodyWindow = 32 << 10

var bodyBufPool = sync.Pool{New: func() any { b := make([]byte, maxFormLen+bodyWindow); return &b }}

func newBodyScan(r io.Reader, sb *Sandbox, host string, cleartext bool, f *forms) *bodyScan {
	return &bodyScan{r: r, sb: sb, host: host, cleartext: cleartext, forms: f}
}

// bodyRefusal is the rule that stopped the request's body, "" when none did (or it is not
// scanned).
func (rs *reqState) bodyRefusal() string {
	if rs.body == nil {
		return ""
	}
	if pe, ok := rs.body.err.(*placeholderError); ok {
		return pe.rule
	}
	return ""
}

func (b *bodyScan) Read(p []byte) (int, error) {
	for {
		if len(b.ready) > 0 {
			n := copy(p, b.ready)
			b.ready = b.ready[n:]
			return n, nil
		}
		if b.err != nil {
			b.release()
			return 0, b.err
		}
		if b.buf == nil {
			b.buf = bodyBufPool.Get().(*[]byte)
		}
		buf := *b.buf
		// What was handed on is gone: the tail moves to the front of the window.
		if b.tail > 0 {
			copy(buf, buf[b.tail:b.tail+b.held])
			b.tail = 0
		}
		n, err := b.r.Read(buf[b.held:])
		win := buf[:b.held+n]
		if n > 0 {
			if rule := b.forms.refusal(win, b.sb, b.host, b.cleartext); rule != "" {
				b.err, b.held = &placeholderError{rule: rule}, 0
				continue
			}
		}
		if err != nil {
			b.ready, b.held, b.err = win, 0, err
			continue
		}
		keep := heldTail(win)
		b.ready, b.tail, b.held = win[:len(win)-keep], len(win)-keep, keep
	}
}

// heldTail is how many trailing bytes of win a body holds back: the trailing run of bytes that
// may be part of an encoded placeholder still being sent, at most maxFormLen.
func heldTail(win []byte) int {
	n := 0
	for n < len(win) && n < maxFormLen && byteClass[win[len(win)-1-n]]&classHold != 0 {
		n++
	}
	return n
}

// release gives the read window back once the body is done with it.
func (b *bodyScan) release() {
	if b.buf != nil {
		bodyBufPool.Put(b.buf)
		b.buf = nil
	}
}

// auditPath is a request path as its audit event names it: this sandbox's placeholders
// redacted, and the whole path withheld when one is there in an encoded form.
func auditPath(sb *Sandbox, path string) string {
	path = redactPlaceholders(sb, path)
	if len(sb.creds) == 0 || len(path) < placeholderLen {
		return path
	}
	var f forms
	if !f.each(stringBytes(path), func(tok []byte) bool { _, ok := sb.placeholderBytes(tok); return !ok }) {
		return "[redacted: the path carries a placeholder]"
	}
	return path
}
