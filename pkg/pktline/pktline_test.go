package pktline

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

const (
	zero = "0000000000000000000000000000000000000000"
	oidA = "1111111111111111111111111111111111111111"
	oidB = "2222222222222222222222222222222222222222"
)

func pkt(s string) []byte { return AppendData(nil, []byte(s)) }

func join(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestReaderPackets(t *testing.T) {
	in := join(pkt("hello\n"), []byte("0000"), []byte("0001"), []byte("0002"), pkt(""))
	r := NewReader(bytes.NewReader(in))
	want := []Kind{Data, Flush, Delim, ResponseEnd, Data}
	for i, k := range want {
		p, err := r.Next()
		if err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		if p.Kind != k {
			t.Fatalf("packet %d: kind %v, want %v", i, p.Kind, k)
		}
		if i == 0 && string(p.Payload) != "hello\n" {
			t.Fatalf("payload %q", p.Payload)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("end: %v, want EOF", err)
	}
}

func TestReaderErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     error
	}{
		{"bad hex", "00zz", ErrMalformed},
		{"reserved 3", "0003", ErrMalformed},
		{"too long", "ffff", ErrMalformed},
		{"short payload", "0009abc", io.ErrUnexpectedEOF},
		{"short header", "00", io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewReader(strings.NewReader(tc.in)).Next()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}

func TestReadUpdateRequest(t *testing.T) {
	pack := []byte("PACK\x00\x00\x00\x02rest-of-pack")
	for _, tc := range []struct {
		name    string
		in      []byte
		want    []Command
		caps    []string
		shallow int
		err     error
	}{
		{
			name: "one update with capabilities",
			in:   join(pkt(oidA+" "+oidB+" refs/heads/nexus/feature\x00report-status side-band-64k agent=git/2.39\n"), []byte("0000")),
			want: []Command{{oidA, oidB, "refs/heads/nexus/feature"}},
			caps: []string{"report-status", "side-band-64k", "agent=git/2.39"},
		},
		{
			name: "several, create and delete, no newline",
			in: join(pkt(zero+" "+oidB+" refs/heads/a\x00report-status"), pkt(oidA+" "+zero+" refs/tags/v1"),
				pkt(oidA+" "+oidB+" refs/heads/main\n"), []byte("0000")),
			want: []Command{{zero, oidB, "refs/heads/a"}, {oidA, zero, "refs/tags/v1"}, {oidA, oidB, "refs/heads/main"}},
			caps: []string{"report-status"},
		},
		{
			name:    "shallow first",
			in:      join(pkt("shallow "+oidA+"\n"), pkt(oidA+" "+oidB+" refs/heads/x\x00\n"), []byte("0000")),
			want:    []Command{{oidA, oidB, "refs/heads/x"}},
			shallow: 1,
		},
		{name: "probe: flush only", in: []byte("0000"), want: []Command{}},
		{name: "sha256", in: join(pkt(strings.Repeat("a", 64)+" "+strings.Repeat("b", 64)+" refs/heads/y"), []byte("0000")),
			want: []Command{{strings.Repeat("a", 64), strings.Repeat("b", 64), "refs/heads/y"}}},
		{name: "empty", in: nil, err: ErrMalformed},
		{name: "no flush", in: pkt(oidA + " " + oidB + " refs/heads/x\n"), err: ErrMalformed},
		{name: "mixed oid lengths", in: join(pkt(oidA+" "+strings.Repeat("b", 64)+" refs/heads/x"), []byte("0000")), err: ErrMalformed},
		{name: "upper-case oid", in: join(pkt(strings.ToUpper("abcdef"+oidA[6:])+" "+oidB+" refs/heads/x"), []byte("0000")), err: ErrMalformed},
		{name: "ref with space", in: join(pkt(oidA+" "+oidB+" refs/heads/a b"), []byte("0000")), err: ErrMalformed},
		{name: "ref with newline inside", in: join(pkt(oidA+" "+oidB+" refs/heads/a\nb"), []byte("0000")), err: ErrMalformed},
		{name: "ref dotdot", in: join(pkt(oidA+" "+oidB+" refs/heads/../x"), []byte("0000")), err: ErrMalformed},
		{name: "ref not under refs", in: join(pkt(oidA+" "+oidB+" HEAD"), []byte("0000")), err: ErrMalformed},
		{name: "capabilities only on first", in: join(pkt(oidA+" "+oidB+" refs/heads/a"), pkt(oidA+" "+oidB+" refs/heads/b\x00caps"), []byte("0000")), err: ErrMalformed},
		{name: "push-cert", in: join(pkt("push-cert\x00report-status\n"), pkt("certificate version 0.1\n")), err: ErrSignedPush},
		{name: "delim", in: []byte("0001"), err: ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := join(tc.in, pack)
			r := bytes.NewReader(in)
			req, raw, err := ReadUpdateRequest(r, Limits{})
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				if strings.ContainsAny(err.Error(), "\n\x00") {
					t.Fatalf("error is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(req.Commands) != len(tc.want) {
				t.Fatalf("commands %+v, want %+v", req.Commands, tc.want)
			}
			for i := range tc.want {
				if req.Commands[i] != tc.want[i] {
					t.Fatalf("command %d %+v, want %+v", i, req.Commands[i], tc.want[i])
				}
			}
			if strings.Join(req.Capabilities, " ") != strings.Join(tc.caps, " ") {
				t.Fatalf("caps %q, want %q", req.Capabilities, tc.caps)
			}
			if len(req.Shallow) != tc.shallow {
				t.Fatalf("shallow %v", req.Shallow)
			}
			// Exactly the command section was consumed: raw + the rest is the input.
			rest, _ := io.ReadAll(r)
			if !bytes.Equal(join(raw, rest), in) || !bytes.Equal(rest, pack) {
				t.Fatalf("consumed %q, rest %q", raw, rest)
			}
		})
	}
}

func TestReadUpdateRequestLimits(t *testing.T) {
	var in []byte
	for i := 0; i < 10; i++ {
		in = append(in, pkt(oidA+" "+oidB+" refs/heads/b"+strings.Repeat("x", i))...)
	}
	in = append(in, "0000"...)
	if _, _, err := ReadUpdateRequest(bytes.NewReader(in), Limits{MaxCommands: 5}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("commands limit: %v", err)
	}
	if _, _, err := ReadUpdateRequest(bytes.NewReader(in), Limits{MaxBytes: 200}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("bytes limit: %v", err)
	}
	if _, _, err := ReadUpdateRequest(bytes.NewReader(in), Limits{MaxBytes: len(in)}); err != nil {
		t.Fatalf("exact limit: %v", err)
	}
	// An endless stream of data lines stops at the byte bound, not at the end of the input.
	endless := io.MultiReader(bytes.NewReader(pkt(oidA+" "+oidB+" refs/heads/a")), infinite{})
	if _, _, err := ReadUpdateRequest(endless, Limits{MaxBytes: 1 << 16}); !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrMalformed) {
		t.Fatalf("endless: %v", err)
	}
}

type infinite struct{}

func (infinite) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = "0005a"[i%5]
	}
	return len(p), nil
}

func TestCommandDelete(t *testing.T) {
	if !(Command{Old: oidA, New: zero}).Delete() || (Command{Old: zero, New: oidA}).Delete() {
		t.Fatal("Delete")
	}
}

func FuzzReadUpdateRequest(f *testing.F) {
	f.Add(join(pkt(oidA+" "+oidB+" refs/heads/nexus/feature\x00report-status side-band-64k\n"), []byte("0000PACK")))
	f.Add([]byte("0000"))
	f.Add(join(pkt("shallow "+oidA), pkt(zero+" "+oidB+" refs/heads/main"), []byte("0000")))
	f.Add(join(pkt("push-cert\x00x"), []byte("0000")))
	f.Add([]byte("0004000100020003ffff"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		req, raw, err := ReadUpdateRequest(r, Limits{MaxBytes: 4096, MaxCommands: 16})
		if err != nil {
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		if len(raw) > 4096 || len(req.Commands) > 16 {
			t.Fatalf("limits exceeded: %d bytes, %d commands", len(raw), len(req.Commands))
		}
		if !bytes.HasPrefix(in, raw) || !bytes.HasSuffix(raw, []byte("0000")) {
			t.Fatalf("raw is not the consumed prefix ending in a flush")
		}
		if rest, _ := io.ReadAll(r); len(raw)+len(rest) != len(in) {
			t.Fatalf("consumed past the command section")
		}
		for _, c := range req.Commands {
			if CheckRefName(c.Ref) != nil || strings.ContainsAny(c.Ref, " \n\x00") {
				t.Fatalf("accepted bad ref %q", c.Ref)
			}
		}
	})
}
