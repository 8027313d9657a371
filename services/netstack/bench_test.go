package netstack_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/services/netstack"
	"github.com/IniZio/nexus/services/netstack/internal/fakeguest"
)

// benchServer is a loopback TCP server: for "sink" connections it reads everything and answers
// with one byte at EOF; connections that send nothing get one byte at once (connect benchmark).
func benchServer(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var mode [1]byte
				if _, err := io.ReadFull(c, mode[:]); err != nil {
					return
				}
				if mode[0] == 'c' { // connect: answer at once
					_, _ = c.Write([]byte{1})
					return
				}
				_, _ = io.Copy(io.Discard, c)
				_, _ = c.Write([]byte{1})
			}()
		}
	}()
	return ln.Addr().String()
}

// dialer is what the benchmarks drive: a fake guest and the address of the loopback server as
// the guest sees it.
type benchTarget struct {
	guest *fakeguest.Guest
	dst   netip.AddrPort
}

func ourNetstack(b *testing.B, serverAddr string) benchTarget {
	b.Helper()
	_, port, _ := net.SplitHostPort(serverAddr)
	svc, err := netstack.NewManager(netstack.ManagerConfig{
		Logger:            zerolog.Nop(),
		Audit:             audit.SinkFunc(func(context.Context, audit.Event) {}),
		UpstreamDNS:       "127.0.0.1:9", // unused: bench.test is an override
		ResolverOverrides: map[string]string{"bench.test": serverAddr},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(svc.Close)
	sock := shortSocket(b)
	if _, err := svc.CreateNetwork(context.Background(), netstack.Spec{
		SandboxID: "bench", SocketPath: sock,
		Policy: netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rules(b, "bench.test:"+port)},
		// The benchmarks measure the data path, not the budgets: connect and throughput run far
		// past a sandbox's default connection rate and bandwidth.
		Limits: netstackapi.Limits{ConnRate: 1 << 20, EgressBandwidth: 1 << 40, IngressBandwidth: 1 << 40},
	}); err != nil {
		b.Fatal(err)
	}
	g, err := fakeguest.Dial(context.Background(), sock, fakeguest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ips, err := g.LookupA(ctx, "bench.test")
	if err != nil {
		b.Fatal(err)
	}
	p, _ := netip.ParseAddrPort(serverAddr)
	return benchTarget{guest: g, dst: netip.AddrPortFrom(ips[0], p.Port())}
}

var (
	gvproxyOnce sync.Once
	gvproxyBin  string
	gvproxyErr  error
)

// buildGvproxy builds upstream gvproxy from the module version in go.mod.
func buildGvproxy() (string, error) {
	gvproxyOnce.Do(func() {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/containers/gvisor-tap-vsock").Output()
		if err != nil {
			gvproxyErr = fmt.Errorf("locate gvisor-tap-vsock: %w", err)
			return
		}
		dir, err := os.MkdirTemp("", "gvproxy")
		if err != nil {
			gvproxyErr = err
			return
		}
		bin := filepath.Join(dir, "gvproxy")
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/gvproxy")
		cmd.Dir = strings.TrimSpace(string(out))
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
		if msg, err := cmd.CombinedOutput(); err != nil {
			gvproxyErr = fmt.Errorf("build gvproxy: %v: %s", err, msg)
			return
		}
		gvproxyBin = bin
	})
	return gvproxyBin, gvproxyErr
}

// upstreamGvproxy runs gvproxy listening for QEMU on a unix socket; the loopback server is
// reached through its NAT address 192.168.127.254.
func upstreamGvproxy(b *testing.B, serverAddr string) benchTarget {
	b.Helper()
	bin, err := buildGvproxy()
	if err != nil {
		b.Skip(err)
	}
	sock := shortSocket(b)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	sshPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "-listen-qemu", "unix://"+sock, "-ssh-port", fmt.Sprint(sshPort))
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testutil.WaitFor(b, 10*time.Second, func() error { _, err := os.Stat(sock); return err })
	g, err := fakeguest.Dial(context.Background(), sock, fakeguest.Options{GatewayMAC: "5a:94:ef:e4:0c:dd"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	p, _ := netip.ParseAddrPort(serverAddr)
	return benchTarget{guest: g, dst: netip.AddrPortFrom(netip.MustParseAddr("192.168.127.254"), p.Port())}
}

func benchThroughput(b *testing.B, tgt benchTarget) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := tgt.guest.DialTCP(ctx, tgt.dst)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	chunk := make([]byte, 1<<20)
	chunk[0] = 's'
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(chunk); err != nil {
			b.Fatal(err)
		}
		chunk[0] = 0
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		b.Fatalf("ack: %v", err)
	}
	b.StopTimer()
}

func benchConnect(b *testing.B, tgt benchTarget) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := tgt.guest.DialTCP(ctx, tgt.dst)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write([]byte{'c'}); err != nil {
			b.Fatal(err)
		}
		var one [1]byte
		if _, err := io.ReadFull(c, one[:]); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkThroughput: guest → loopback server through our netstack (curated, plain TCP proxy).
func BenchmarkThroughput(b *testing.B) { benchThroughput(b, ourNetstack(b, benchServer(b))) }

// BenchmarkConnect: connect + 1-byte round trip per iteration through our netstack.
func BenchmarkConnect(b *testing.B) { benchConnect(b, ourNetstack(b, benchServer(b))) }

// BenchmarkThroughputGvproxy is BenchmarkThroughput through upstream gvproxy.
func BenchmarkThroughputGvproxy(b *testing.B) { benchThroughput(b, upstreamGvproxy(b, benchServer(b))) }

// BenchmarkConnectGvproxy is BenchmarkConnect through upstream gvproxy.
func BenchmarkConnectGvproxy(b *testing.B) { benchConnect(b, upstreamGvproxy(b, benchServer(b))) }
