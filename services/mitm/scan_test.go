package mitm

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
)

// scanSandbox has placeholder bound to api.example.com.
func scanSandbox(t testing.TB) *Sandbox {
	t.Helper()
	sb, err := NewSandbox(mitmapi.SandboxPolicy{
		ID: testSandbox, TokenHash: mitmapi.HashHex(testToken), AllowedHosts: []string{"api.example.com", "other.example.com"},
		Credentials: []mitmapi.CredentialBinding{{PlaceholderHash: mitmapi.HashHex(placeholder), Hosts: []string{"api.example.com"}}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func pctAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

// pctSome encodes every other character, the hex of the escapes in lower case.
func pctSome(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if i%2 == 0 {
			fmt.Fprintf(&b, "%%%02x", s[i])
		} else {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

func jsonEsc(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, `\u%04x`, s[i])
	}
	return b.String()
}

// placeholderForms is the placeholder in every form the scanner must recognise.
func placeholderForms() []struct{ name, form string } {
	up := strings.ToUpper(placeholder)
	b64 := base64.StdEncoding.EncodeToString
	slashy := b64([]byte("\xff\xff\xff" + placeholder)) // starts with ////: JSON escapes them
	return []struct{ name, form string }{
		{"raw", placeholder},
		{"raw upper case", up},
		{"raw mixed case", up[:32] + placeholder[32:]},
		{"raw after hex digits", "00ff" + placeholder},
		{"raw before hex digits", placeholder + "c0ffee"},
		{"raw inside a hex run", "deadbeef" + placeholder + "deadbeef"},
		{"percent-encoded", pctAll(placeholder)},
		{"percent-encoded upper-case digits", pctAll(up)},
		{"partly percent-encoded", pctSome(placeholder)},
		{"percent-encoded twice", strings.ReplaceAll(pctAll(placeholder), "%", "%25")},
		{"json-escaped", jsonEsc(placeholder)},
		{"partly json-escaped", jsonEsc(placeholder[:10]) + placeholder[10:]},
		{"base64", b64([]byte(placeholder))},
		{"base64 second alignment", b64([]byte("x" + placeholder))},
		{"base64 third alignment", b64([]byte("xy" + placeholder))},
		{"base64 unpadded", base64.RawStdEncoding.EncodeToString([]byte("xy" + placeholder))},
		{"base64 url alphabet", base64.RawURLEncoding.EncodeToString([]byte("\xfb\xff\xfe" + placeholder + "\xfb\xff"))},
		{"base64 of upper case", b64([]byte(up))},
		{"basic credentials", "Basic " + b64([]byte("x-access-token:"+placeholder))},
		{"base64 with json-escaped slashes", strings.ReplaceAll(slashy, "/", `\/`)},
		{"base64 percent-encoded", strings.NewReplacer("+", "%2B", "/", "%2F", "=", "%3D").Replace(slashy)},
		{"base64 json-escaped", jsonEsc(b64([]byte("x" + placeholder)))},
	}
}

// TestScanFindsEveryForm: a placeholder is recognised in each encoded form, alone and inside
// text around it, in a head field and a body alike.
func TestScanFindsEveryForm(t *testing.T) {
	sb := scanSandbox(t)
	contexts := []struct{ name, before, after string }{
		{"alone", "", ""},
		{"json", `{"text": "`, `", "n": 1}`},
		{"query", "/v1/x?a=1&key=", "&b=2"},
		{"words", "see ", " there"},
	}
	for _, fm := range placeholderForms() {
		for _, c := range contexts {
			t.Run(fm.name+"/"+c.name, func(t *testing.T) {
				in := c.before + fm.form + c.after
				var f forms
				if got := f.refusal([]byte(in), sb, "other.example.com", false); got != RulePlaceholderLeak {
					t.Fatalf("in %q: refusal %q on another host, want %s", in, got, RulePlaceholderLeak)
				}
				if got := f.refusal([]byte(in), sb, "api.example.com", false); got != "" {
					t.Fatalf("refusal %q on the bound host over TLS, want none", got)
				}
				if got := f.refusal([]byte(in), sb, "api.example.com", true); got != RulePlaceholderCleartext {
					t.Fatalf("refusal %q on the bound host in cleartext, want %s", got, RulePlaceholderCleartext)
				}
			})
		}
	}
}

// TestScanIgnoresOthers: other hex, near misses and ordinary traffic are not placeholders.
func TestScanIgnoresOthers(t *testing.T) {
	sb := scanSandbox(t)
	other := strings.Repeat("0123456789abcdef", 4)
	for _, in := range []string{
		other,
		placeholder[:63],
		placeholder[:32] + "-" + placeholder[32:],
		base64.StdEncoding.EncodeToString([]byte(placeholder[:63])),
		pctAll(placeholder[:63]) + "%",
		strings.Repeat("lorem ipsum dolor sit amet ", 100),
		base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xfe, 0x01, 0x7f}, 2000)),
		"%" + placeholder[:2], // an escape cut short
	} {
		var f forms
		if got := f.refusal([]byte(in), sb, "other.example.com", true); got != "" {
			t.Errorf("%.40q...: refusal %q, want none", in, got)
		}
	}
}

// TestScanLongHexRuns: in a run longer than a placeholder its first and last windows are
// always tried, inner ones within the request's budget.
func TestScanLongHexRuns(t *testing.T) {
	sb := scanSandbox(t)
	pad := strings.Repeat("0", 3*longRunBudget)
	for _, c := range []struct {
		name, in string
		found    bool
	}{
		{"at the start of a long run", placeholder + pad, true},
		{"at the end of a long run", pad + placeholder, true},
		{"inside, within the budget", pad[:1000] + placeholder + pad[:1000], true},
		{"inside, past the budget", pad + placeholder + pad, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var f forms
			got := f.refusal([]byte(c.in), sb, "other.example.com", false)
			if (got != "") != c.found {
				t.Fatalf("refusal %q, want found=%v", got, c.found)
			}
		})
	}
}

// chunkReader returns at most n bytes per Read.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.n {
		p = p[:c.n]
	}
	return c.r.Read(p)
}

// TestBodyScanAcrossReads: a streamed body is refused whatever the read sizes split the
// placeholder into, and no byte of its form is handed on before the refusal; a body without
// one is handed on whole; one bound to the host passes as it is.
func TestBodyScanAcrossReads(t *testing.T) {
	sb := scanSandbox(t)
	fillers := map[string]string{
		"text":         strings.Repeat("lorem ipsum, dolor sit amet. ", 3000),
		"one long run": strings.Repeat("x", 70000),
	}
	sizes := []int{1, 7, 63, 64, 65, 511, 4096, 1 << 20}
	for fname, filler := range fillers {
		for _, fm := range placeholderForms() {
			for _, n := range sizes {
				if n == 1 && fname == "one long run" {
					continue // quadratic in the test's own reads; the text filler covers one-byte reads
				}
				body := filler + " " + fm.form + " " + filler[:100]
				// The form's first byte that may be part of the encoding ("Basic " is not).
				start := len(filler) + 1 + strings.LastIndexByte(fm.form, ' ') + 1
				bs := newBodyScan(&chunkReader{strings.NewReader(body), n}, sb, "other.example.com", false, &forms{})
				got, err := io.ReadAll(bs)
				var pe *placeholderError
				if !errors.As(err, &pe) || pe.rule != RulePlaceholderLeak {
					t.Fatalf("%s/%s/reads of %d: err %v, want %s", fname, fm.name, n, err, RulePlaceholderLeak)
				}
				if len(got) > start || !strings.HasPrefix(body, string(got)) {
					t.Fatalf("%s/%s/reads of %d: %d bytes handed on, the form starts at %d", fname, fm.name, n, len(got), start)
				}
			}
		}
		for _, n := range sizes {
			body := filler + " " + placeholder + " " + filler
			bs := newBodyScan(&chunkReader{strings.NewReader(body), n}, sb, "api.example.com", false, &forms{})
			if got, err := io.ReadAll(bs); err != nil || string(got) != body {
				t.Fatalf("%s/bound placeholder/reads of %d: %d of %d bytes, err %v", fname, n, len(got), len(body), err)
			}
			bs = newBodyScan(&chunkReader{strings.NewReader(body), n}, sb, "api.example.com", true, &forms{})
			var pe *placeholderError
			if _, err := io.ReadAll(bs); !errors.As(err, &pe) || pe.rule != RulePlaceholderCleartext {
				t.Fatalf("%s/cleartext/reads of %d: err %v", fname, n, err)
			}
		}
	}
}

// TestBodyScanHoldsBackLittle: bytes that cannot start an encoded placeholder are handed on
// at once (a streaming client waiting for an answer after a line is not held up), and at most
// maxFormLen bytes are held back.
func TestBodyScanHoldsBackLittle(t *testing.T) {
	sb := scanSandbox(t)
	pr, pw := io.Pipe()
	bs := newBodyScan(pr, sb, "api.example.com", false, &forms{})
	go pw.Write([]byte(`{"event": 1}` + "\n"))
	buf := make([]byte, 64)
	n, err := bs.Read(buf)
	if err != nil || string(buf[:n]) != `{"event": 1}`+"\n" {
		t.Fatalf("first event: %q, %v", buf[:n], err)
	}
	go pw.Write([]byte(strings.Repeat("x", 2000)))
	n, err = bs.Read(buf)
	if err != nil || n == 0 {
		t.Fatalf("long run: %d bytes, %v", n, err)
	}
	total := n
	for total < 2000-maxFormLen {
		n, err = bs.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total != 2000-maxFormLen {
		t.Fatalf("%d of a 2000-byte run handed on before more came, want %d", total, 2000-maxFormLen)
	}
	pw.Close()
	rest, err := io.ReadAll(bs)
	if err != nil || len(rest) != maxFormLen {
		t.Fatalf("at the end: %d bytes, %v", len(rest), err)
	}
}

// TestAuditPathWithholdsEncodedPlaceholders: an audit event's path never carries a placeholder
// in any form.
func TestAuditPathWithholdsEncodedPlaceholders(t *testing.T) {
	sb := scanSandbox(t)
	if got := auditPath(sb, "/a/"+placeholder+"/b"); got != "/a/[placeholder]/b" {
		t.Errorf("raw: %q", got)
	}
	b64 := base64.RawURLEncoding.EncodeToString([]byte(placeholder))
	if got := auditPath(sb, "/a/"+b64); strings.Contains(got, b64) {
		t.Errorf("base64: %q", got)
	}
	if got := auditPath(sb, "/a/b"); got != "/a/b" {
		t.Errorf("plain: %q", got)
	}
}

// randomBytes is n bytes of a fixed pseudo-random sequence (an image's or an archive's entropy).
func randomBytes(n int) []byte {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func BenchmarkBodyScan(b *testing.B) {
	sb := scanSandbox(b)
	for _, c := range []struct{ name, body string }{
		{"json text", strings.Repeat(`{"role": "user", "content": "lorem ipsum dolor sit amet"}, `, 20000)},
		{"base64", base64.StdEncoding.EncodeToString(randomBytes(1 << 20))},
		{"hex digests", strings.Repeat(strings.Repeat("0123456789abcdef", 4)+"\n", 16000)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for range b.N {
				bs := newBodyScan(strings.NewReader(c.body), sb, "api.example.com", false, &forms{})
				if _, err := io.Copy(io.Discard, bs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzBodyScan: whatever surrounds it and however the reads split the body, a placeholder in
// any known form, set off by spaces, is refused on a host it is not bound to before any byte of
// its form is handed on; and no input makes the scan fail otherwise.
func FuzzBodyScan(f *testing.F) {
	f.Add([]byte("lorem ipsum"), uint16(5), uint8(0), uint16(7))
	f.Add([]byte(`{"a": "%41%42", "b": "\u0041\/"}`), uint16(12), uint8(6), uint16(1))
	f.Add([]byte(strings.Repeat("QUFB", 100)), uint16(200), uint8(13), uint16(64))
	f.Add([]byte(strings.Repeat("0", 300)), uint16(150), uint8(5), uint16(511))
	known := placeholderForms()
	sb := scanSandbox(f)
	f.Fuzz(func(t *testing.T, data []byte, at uint16, enc uint8, chunk uint16) {
		if len(data) > 4<<10 { // one-byte reads of longer bodies only slow the fuzzer down
			return
		}
		n := int(chunk)%4096 + 1
		// The input alone: any answer, no failure.
		bs := newBodyScan(&chunkReader{bytes.NewReader(data), n}, sb, "other.example.com", false, &forms{})
		if got, err := io.ReadAll(bs); err == nil && !bytes.Equal(got, data) {
			t.Fatalf("handed on %d bytes of %d", len(got), len(data))
		}
		form := known[int(enc)%len(known)].form
		i := int(at) % (len(data) + 1)
		body := string(data[:i]) + " " + form + " " + string(data[i:])
		start := i + 1 + strings.LastIndexByte(form, ' ') + 1
		bs = newBodyScan(&chunkReader{strings.NewReader(body), n}, sb, "other.example.com", false, &forms{})
		got, err := io.ReadAll(bs)
		var pe *placeholderError
		if !errors.As(err, &pe) || pe.rule != RulePlaceholderLeak {
			t.Fatalf("%s at %d: err %v", known[int(enc)%len(known)].name, i, err)
		}
		if len(got) > start {
			t.Fatalf("%d bytes handed on, the form starts at %d", len(got), start)
		}
	})
}
