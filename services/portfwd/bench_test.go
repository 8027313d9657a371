package portfwd

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

// The benchmarks compare a forward (host port → portfwd → unix hybrid-vsock socket → fake
// guest → loopback server) with the same server dialled directly. The fake guest here is a
// plain unix-socket relay, so this measures the forwarder's own cost; the real guest path
// (agent yamux over virtio-serial) is measured in e2e/portfwd.

// benchTargets starts a stack with one forward to backend and returns (forwarded, direct).
func benchTargets(b *testing.B, backend string) (string, string) {
	st := newStack(b, nil)
	g := startFakeGuest(b, st, "sb-bench")
	p := freePort(b)
	g.set(int(p), backend)
	st.listeners("sb-bench", "default/bench", p)
	testutil.WaitFor(b, 5*time.Second, func() error {
		_, err := forwardState(st, "sb-bench", p)
		return err
	})
	return hostAddr(p), backend
}

func connectRoundTrip(b *testing.B, addr string) {
	b.Helper()
	buf := make([]byte, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write([]byte{'x'}); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkForwardConnect is connect + first byte round trip through a forward.
func BenchmarkForwardConnect(b *testing.B) {
	fwd, _ := benchTargets(b, echoServer(b))
	connectRoundTrip(b, fwd)
}

// BenchmarkDirectConnect is the same against the server itself (the loopback baseline).
func BenchmarkDirectConnect(b *testing.B) {
	connectRoundTrip(b, echoServer(b))
}

// sinkServer reads each connection to EOF and answers the byte count.
func sinkServer(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				binary.Write(c, binary.BigEndian, n)
			}()
		}
	}()
	return l.Addr().String()
}

const chunk = 256 << 10

func throughput(b *testing.B, addr string) {
	b.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, chunk)
	b.SetBytes(chunk)
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	var n int64
	if err := binary.Read(c, binary.BigEndian, &n); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if n != int64(b.N)*chunk {
		b.Fatalf("sink got %d bytes, sent %d", n, int64(b.N)*chunk)
	}
}

// BenchmarkForwardThroughput is host → guest bulk transfer through a forward.
func BenchmarkForwardThroughput(b *testing.B) {
	fwd, _ := benchTargets(b, sinkServer(b))
	throughput(b, fwd)
}

// BenchmarkDirectThroughput is the same straight to the server.
func BenchmarkDirectThroughput(b *testing.B) {
	throughput(b, sinkServer(b))
}
