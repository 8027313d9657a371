package gitrelay

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFramesRoundTrip(t *testing.T) {
	var b bytes.Buffer
	big := bytes.Repeat([]byte("x"), MaxFrame+10)
	WriteFrame(&b, FrameHello, []byte(`{"args":["git@github.com"]}`))
	FrameWriter{W: &b, Typ: FrameStdin}.Write(big)
	WriteFrame(&b, FrameStdinEOF, nil)
	WriteFrame(&b, FrameExit, ExitPayload(-1))
	fr := NewFrameReader(&b)
	want := []struct {
		typ byte
		n   int
	}{{FrameHello, 27}, {FrameStdin, MaxFrame}, {FrameStdin, 10}, {FrameStdinEOF, 0}, {FrameExit, 4}}
	for _, w := range want {
		typ, p, err := fr.Next(0)
		if err != nil || typ != w.typ || len(p) != w.n {
			t.Fatalf("frame %q/%d: got %q/%d %v", w.typ, w.n, typ, len(p), err)
		}
		if typ == FrameExit {
			if code, err := ParseExit(p); err != nil || code != -1 {
				t.Fatalf("exit %d %v", code, err)
			}
		}
	}
	if _, _, err := fr.Next(0); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	if err := WriteFrame(io.Discard, FrameStdout, big); !errors.Is(err, ErrFrame) {
		t.Fatalf("oversized frame: %v", err)
	}
}

// FuzzFrameReader: arbitrary guest bytes never make the reader return more than the limit or
// panic, and a well-formed frame sequence reads back exactly.
func FuzzFrameReader(f *testing.F) {
	var b bytes.Buffer
	WriteFrame(&b, FrameHello, []byte(`{"args":[]}`))
	WriteFrame(&b, FrameStdin, []byte("0000"))
	f.Add(b.Bytes(), 100)
	f.Add([]byte("H\xff\xff\xff\xff"), 16)
	f.Add([]byte("X\x00\x00\x00\x04\x00\x00"), 0)
	f.Fuzz(func(t *testing.T, data []byte, max int) {
		fr := NewFrameReader(bytes.NewReader(data))
		limit := max
		if limit <= 0 || limit > MaxFrame {
			limit = MaxFrame
		}
		total := 0
		for {
			typ, p, err := fr.Next(max)
			if err != nil {
				return
			}
			if len(p) > limit {
				t.Fatalf("payload %d over limit %d", len(p), limit)
			}
			total += 5 + len(p)
			if total > len(data) {
				t.Fatalf("read %d bytes from %d", total, len(data))
			}
			if typ == FrameExit {
				ParseExit(p)
			}
		}
	})
}
