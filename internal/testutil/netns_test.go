package testutil

import (
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

func TestCanaryRecordsWhatArrives(t *testing.T) {
	c := NewCanary(t, CanaryConfig{
		Addrs: []string{"10.20.0.5/24", "169.254.169.254", "100.64.0.9", "fd00:20::5/64"},
		TCP:   []int{80},
		UDP:   []int{53},
	})
	c.RequireNothingArrived(t)
	for _, a := range c.Addrs {
		addr := netip.AddrPortFrom(a, 80).String()
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(conn)
		conn.Close()
		if !strings.HasSuffix(string(got), "canary\n") {
			t.Fatalf("%s answered %q", addr, got)
		}
	}
	u, err := net.Dial("udp", "10.20.0.5:53")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	_, _ = u.Write([]byte("ping"))
	_ = u.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	if n, err := u.Read(buf); err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("udp echo: %q %v", buf[:n], err)
	}
	got := c.Arrived()
	if len(got) != 5 {
		t.Fatalf("arrived %v, want 4 tcp and 1 udp", got)
	}
	for i, a := range c.Addrs {
		if got[i].Network != "tcp" || got[i].Local.Addr() != a || !strings.HasPrefix(string(got[i].Data), "GET / ") {
			t.Errorf("arrival %d = %v %q, want tcp to %s", i, got[i], got[i].Data, a)
		}
	}
	if got[4].Network != "udp" || got[4].Bytes != 4 {
		t.Errorf("arrival 4 = %v, want a 4-byte datagram", got[4])
	}
	name := c.Name
	c.Close()
	if err := ipCmd("netns", "exec", name, "true"); err == nil {
		t.Errorf("namespace %s still there after Close", name)
	}
}

func TestListeners(t *testing.T) {
	lo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Close()
	all, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	ls, err := Listeners(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var sawLo, sawAll bool
	for _, l := range ls {
		sawLo = sawLo || l.Addr.String() == lo.Addr().String()
		sawAll = sawAll || (l.Addr.Addr().IsUnspecified() && int(l.Addr.Port()) == all.Addr().(*net.TCPAddr).Port)
	}
	if !sawLo || !sawAll {
		t.Fatalf("Listeners = %v: want %s and [::]:%d", ls, lo.Addr(), all.Addr().(*net.TCPAddr).Port)
	}
}
