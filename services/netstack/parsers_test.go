package netstack

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"
)

// clientHello captures the first flight a real crypto/tls client sends for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		tc := tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
		_ = tc.Handshake()
		c.Close()
	}()
	var out []byte
	buf := make([]byte, 4096)
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, err := s.Read(buf)
		out = append(out, buf[:n]...)
		if _, perr := parseClientHello(out); perr == nil || !errors.Is(perr, errNeedMore) {
			break
		}
		if err != nil {
			t.Fatalf("capture client hello: %v", err)
		}
	}
	return out
}

// splitRecords re-frames a single-record ClientHello into records of at most n payload bytes, as a
// client with a small record size (or a middlebox) might.
func splitRecords(hello []byte, n int) []byte {
	payload := hello[5:]
	var out []byte
	for len(payload) > 0 {
		k := min(n, len(payload))
		out = append(out, 22, 3, 1, byte(k>>8), byte(k))
		out = append(out, payload[:k]...)
		payload = payload[k:]
	}
	return out
}

func TestParseClientHello(t *testing.T) {
	hello := clientHello(t, "API.Example.com")
	name, err := parseClientHello(hello)
	if err != nil || name != "api.example.com" {
		t.Fatalf("parseClientHello = %q, %v", name, err)
	}
	// Every strict prefix needs more data; never a wrong answer.
	for i := 0; i < len(hello); i++ {
		if n, err := parseClientHello(hello[:i]); !errors.Is(err, errNeedMore) {
			t.Fatalf("prefix %d: %q, %v; want errNeedMore", i, n, err)
		}
	}
	// Records split into small pieces.
	for _, size := range []int{1, 7, 100, 512} {
		split := splitRecords(hello, size)
		if n, err := parseClientHello(split); err != nil || n != "api.example.com" {
			t.Fatalf("split %d: %q, %v", size, n, err)
		}
	}
	// Trailing bytes after the message do not matter.
	if n, err := parseClientHello(append(bytes.Clone(hello), 23, 3, 3, 0, 1, 0)); err != nil || n != "api.example.com" {
		t.Fatalf("trailing: %q, %v", n, err)
	}
	// No SNI (an IP literal as ServerName sends none).
	if _, err := parseClientHello(clientHello(t, "10.0.0.1")); !errors.Is(err, errNoSNI) {
		t.Fatalf("no sni: %v", err)
	}
	for _, bad := range [][]byte{
		[]byte("GET / HTTP/1.1\r\n"),
		{22, 3, 1, 0, 0},
		{22, 3, 1, 0xff, 0xff},
		{22, 3, 1, 0, 4, 2, 0, 0, 0},          // server_hello
		{22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff}, // huge
	} {
		if n, err := parseClientHello(bad); err == nil || errors.Is(err, errNeedMore) {
			t.Errorf("parseClientHello(%q) = %q, %v; want error", bad, n, err)
		}
	}
}

func TestParseHTTPHost(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		err  error
	}{
		{"GET / HTTP/1.1\r\nHost: Example.COM\r\n\r\n", "example.com", nil},
		{"GET / HTTP/1.1\r\nUser-Agent: x\r\nhost: example.com:8080\r\n\r\nbody", "example.com", nil},
		{"GET http://example.com/x HTTP/1.1\r\nHost: example.com\r\n\r\n", "example.com", nil},
		{"GET http://evil.com/x HTTP/1.1\r\nHost: example.com\r\n\r\n", "", errBadHost},
		{"GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n", "", errBadHost},
		{"GET / HTTP/1.1\r\nX: y\r\n\r\n", "", errNoHost},
		{"GET / HTTP/1.1\r\nHost: user@evil.com\r\n\r\n", "", errBadHost},
		{"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", "", errBadHost},
		{"GET / HTTP/1.1\r\nHost: a.com:x\r\n\r\n", "", errBadHost},
		{"GET / HTTP/1.1\r\n Host: a.com\r\n\r\n", "", errNotHTTP},
		{"\x16\x03\x01\x00", "", errNotHTTP},
		{"GET / HTTP/1.1\r\nHost: exa", "", errNeedMore},
		{"GET", "", errNeedMore},
		{"SSH-2.0-OpenSSH_9.0\r\n\r\n", "", errNotHTTP},
	} {
		got, err := parseHTTPHost([]byte(tc.in))
		if got != tc.want || !errors.Is(err, tc.err) && !(tc.err == nil && err == nil) {
			t.Errorf("parseHTTPHost(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	if _, err := parseHTTPHost(bytes.Repeat([]byte("A"), maxHTTPHead+1)); err == nil || errors.Is(err, errNeedMore) {
		t.Errorf("oversized head: %v", err)
	}
}

func FuzzParseClientHello(f *testing.F) {
	hello := clientHello(f, "api.example.com")
	f.Add(hello)
	f.Add(splitRecords(hello, 13))
	f.Add(hello[:len(hello)/2])
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := parseClientHello(b)
		if err != nil {
			if name != "" {
				t.Fatalf("name %q with error %v", name, err)
			}
			return
		}
		if name == "" {
			t.Fatal("empty name without error")
		}
		// A complete hello keeps its answer whatever follows it.
		again, err := parseClientHello(append(bytes.Clone(b), 0x17, 3, 3))
		if err != nil || again != name {
			t.Fatalf("with trailing bytes: %q, %v; was %q", again, err, name)
		}
	})
}

func FuzzParseHTTPHost(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"))
	f.Add([]byte("POST http://example.com:80/x HTTP/1.1\r\nhost: example.com:80\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nHo"))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := parseHTTPHost(b)
		if err != nil {
			if name != "" {
				t.Fatalf("name %q with error %v", name, err)
			}
			return
		}
		if name == "" || len(name) > 253 {
			t.Fatalf("bad name %q", name)
		}
	})
}
