package agentproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var b bytes.Buffer
	fw := NewFrameWriter(&b)
	fw.WriteFrame(FrameStdout, []byte("hello"))
	fw.WriteFrame(FrameResize, EncodeResize(40, 120))
	fw.WriteFrame(FrameExit, EncodeExit(137, 9))
	fw.WriteFrame(FrameEnd, nil)
	buf := make([]byte, MaxFramePayload)
	typ, p, err := ReadFrame(&b, buf)
	if err != nil || typ != FrameStdout || string(p) != "hello" {
		t.Fatal(typ, p, err)
	}
	typ, p, _ = ReadFrame(&b, buf)
	if r, c := DecodeResize(p); typ != FrameResize || r != 40 || c != 120 {
		t.Fatal(typ, r, c)
	}
	typ, p, _ = ReadFrame(&b, buf)
	if code, sig := DecodeExit(p); typ != FrameExit || code != 137 || sig != 9 {
		t.Fatal(typ, code, sig)
	}
	if typ, p, err = ReadFrame(&b, buf); typ != FrameEnd || len(p) != 0 || err != nil {
		t.Fatal(typ, p, err)
	}
	if _, _, err := ReadFrame(&b, buf); err != io.EOF {
		t.Fatalf("clean end: %v", err)
	}
	if err := fw.WriteFrame(FrameStdout, make([]byte, MaxFramePayload+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized write: %v", err)
	}
}

// giantReader announces a huge frame and then would stream forever: ReadFrame must refuse it
// from the header alone.
type giantReader struct{ hdr []byte }

func (g *giantReader) Read(p []byte) (int, error) {
	if len(g.hdr) > 0 {
		n := copy(p, g.hdr)
		g.hdr = g.hdr[n:]
		return n, nil
	}
	panic("ReadFrame read past the header of an oversized frame")
}

func TestReadFrameRejects(t *testing.T) {
	buf := make([]byte, MaxFramePayload)
	giant := []byte{byte(FrameStdout), 0xff, 0xff, 0xff, 0xff}
	if _, _, err := ReadFrame(&giantReader{hdr: giant}, buf); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("giant: %v", err)
	}
	small := make([]byte, 16)
	if _, _, err := ReadFrame(&giantReader{hdr: []byte{byte(FrameData), 0, 0, 0, 17}}, small); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("over buffer: %v", err)
	}
	for _, tc := range [][]byte{
		{0, 0, 0, 0, 0},   // type 0
		{200, 0, 0, 0, 0}, // unknown type
		{byte(FrameExit), 0, 0, 0, 4, 1, 2, 3, 4}, // exit must be 8 bytes
		{byte(FrameStdinClose), 0, 0, 0, 1, 0},
	} {
		if _, _, err := ReadFrame(bytes.NewReader(tc), buf); !errors.Is(err, ErrBadFrame) {
			t.Fatalf("%v: %v", tc, err)
		}
	}
	if _, _, err := ReadFrame(bytes.NewReader([]byte{byte(FrameStdout), 0, 0, 0, 9, 'a'}), buf); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated: %v", err)
	}
}

func TestMessages(t *testing.T) {
	var b bytes.Buffer
	if err := WriteMessage(&b, Request{Op: OpConnect, Port: 8080}); err != nil {
		t.Fatal(err)
	}
	req, err := ReadRequest(&b)
	if err != nil || req.Op != OpConnect || req.Port != 8080 {
		t.Fatal(req, err)
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxMessage+1)
	if _, err := ReadRequest(bytes.NewReader(hdr[:])); !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("too large: %v", err)
	}
	for _, body := range []string{`{"op":"nope"}`, `{"op":"exec"}`, `{"op":"connect","port":0}`, `{"op":"dial-host","port":70000}`, `not json`} {
		b.Reset()
		binary.BigEndian.PutUint32(hdr[:], uint32(len(body)))
		b.Write(hdr[:])
		b.WriteString(body)
		if _, err := ReadRequest(&b); err == nil {
			t.Fatalf("%s accepted", body)
		}
	}
	if err := WriteMessage(io.Discard, Request{Op: OpExec, Exec: &ExecRequest{Argv: []string{strings.Repeat("a", MaxMessage)}}}); err == nil {
		t.Fatal("oversized message written")
	}
}

func TestHandshake(t *testing.T) {
	stream := "garbage\x00\x01\nmore NEXUS-AGENT-HELLO zz\n" + strings.Repeat("x", 1000) + "\n" + string(Hello("00112233aabbccdd"))
	nonce, err := AwaitHello(bufio.NewReader(strings.NewReader(stream)))
	if err != nil || nonce != "00112233aabbccdd" {
		t.Fatal(nonce, err)
	}
	stale := string(Ready("1111111111111111")) + "junk" + string(Ready("2222222222222222")) + "yamux"
	br := bufio.NewReader(strings.NewReader(stale))
	if err := AwaitReady(br, "2222222222222222"); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "yamux" {
		t.Fatalf("consumed past the ready line: %q", rest)
	}
	if err := AwaitReady(bufio.NewReader(strings.NewReader("NEXUS-AGENT-READY 1111111111111111\n")), "2222222222222222"); err == nil {
		t.Fatal("wrong nonce accepted")
	}
}

func TestReadConnectLine(t *testing.T) {
	good := map[string]int{"CONNECT 22\n": 22, "CONNECT 65535\n": 65535, "CONNECT 1\nrest": 1}
	for in, want := range good {
		r := strings.NewReader(in)
		got, err := ReadConnectLine(r)
		if err != nil || got != want {
			t.Fatalf("%q: %d %v", in, got, err)
		}
		if rest, _ := io.ReadAll(r); strings.Contains(in, "rest") && string(rest) != "rest" {
			t.Fatalf("over-read: %q", rest)
		}
	}
	for _, in := range []string{"CONNECT 0\n", "CONNECT 65536\n", "CONNECT -1\n", "connect 22\n", "CONNECT  22\n", "CONNECT 22 \n", "CONNECT\n", "CONNECT 000000022\n", strings.Repeat("C", 64)} {
		if _, err := ReadConnectLine(strings.NewReader(in)); err == nil {
			t.Fatalf("%q accepted", in)
		}
	}
}

const procNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12346 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 12347 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12348 1 0000000000000000 100 0 0 10 0
   4: garbage line
`

const procNetTCP6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:1F92 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 100 0 0 10 0
`

func TestParseProcNetTCP(t *testing.T) {
	ls, err := ParseProcNetTCP([]byte(procNetTCP), "tcp")
	if err != nil {
		t.Fatal(err)
	}
	want := []Listener{{"tcp", "127.0.0.1", 8080}, {"tcp", "0.0.0.0", 22}}
	if len(ls) != len(want) || ls[0] != want[0] || ls[1] != want[1] {
		t.Fatalf("got %v want %v", ls, want)
	}
	ls, err = ParseProcNetTCP([]byte(procNetTCP6), "tcp6")
	if err != nil {
		t.Fatal(err)
	}
	want = []Listener{{"tcp6", "::", 80}, {"tcp6", "::1", 8081}, {"tcp6", "127.0.0.1", 8082}}
	if len(ls) != 3 || ls[0] != want[0] || ls[1] != want[1] || ls[2] != want[2] {
		t.Fatalf("got %v want %v", ls, want)
	}
	if _, err := ParseProcNetTCP(nil, "udp"); err == nil {
		t.Fatal("udp accepted")
	}
}

func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	fw := NewFrameWriter(&b)
	fw.WriteFrame(FrameStdout, []byte("out"))
	fw.WriteFrame(FrameExit, EncodeExit(1, 0))
	f.Add(b.Bytes())
	f.Add([]byte{byte(FrameStdout), 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{byte(FrameResize), 0, 0, 0, 4, 0, 24, 0, 80})
	f.Add([]byte{9, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		buf := make([]byte, 1024)
		r := bytes.NewReader(data)
		for {
			typ, p, err := ReadFrame(r, buf)
			if err != nil {
				return
			}
			if len(p) > len(buf) || fixedLen(typ) >= 0 && len(p) != fixedLen(typ) {
				t.Fatalf("bad frame accepted: %s %d", typ, len(p))
			}
		}
	})
}

func FuzzReadHeader(f *testing.F) {
	var b bytes.Buffer
	WriteMessage(&b, Request{Op: OpExec, Exec: &ExecRequest{Argv: []string{"true"}}})
	f.Add(b.Bytes())
	b.Reset()
	WriteMessage(&b, Response{Error: "x", Code: "invalid", Listeners: []Listener{{"tcp", "::", 1}}})
	f.Add(b.Bytes())
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, data []byte) {
		ReadRequest(bytes.NewReader(data))
		ReadResponse(bytes.NewReader(data))
		AwaitHello(bufio.NewReader(bytes.NewReader(data)))
		ReadConnectLine(bytes.NewReader(data))
	})
}

func FuzzParseProcNetTCP(f *testing.F) {
	f.Add([]byte(procNetTCP), false)
	f.Add([]byte(procNetTCP6), true)
	f.Add([]byte("h\n0: 0100007F:1F90 0:0 0A\n"), false)
	f.Fuzz(func(t *testing.T, data []byte, v6 bool) {
		proto := "tcp"
		if v6 {
			proto = "tcp6"
		}
		ls, _ := ParseProcNetTCP(data, proto)
		for _, l := range ls {
			if l.Proto != proto || l.IP == "" {
				t.Fatalf("bad listener %+v", l)
			}
		}
	})
}
