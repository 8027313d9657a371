package testutil

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
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

func TestLANHostsReachOnlyEachOther(t *testing.T) {
	l := NewLAN(t, 2)
	var ln net.Listener
	if err := l.InHost(1, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(l.Hosts[1].Addr, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host 2\n"))
			c.Close()
		}
	}()
	var got []byte
	if err := l.InHost(0, func() error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		got, err = io.ReadAll(c)
		return err
	}); err != nil {
		t.Fatalf("host 1 cannot reach host 2: %v", err)
	}
	if string(got) != "host 2\n" {
		t.Fatalf("host 1 read %q from host 2", got)
	}
	// The bridge has no address here: the hosts' network is out of this namespace's reach.
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatalf("the test's own namespace reached host 2 at %s", ln.Addr())
	}

	sleeper := exec.Command("nsenter", "--net=/run/netns/"+l.Hosts[0].Netns, "--", "sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sleeper.Wait() }()
	WaitFor(t, 10*time.Second, func() error {
		pids, err := l.Pids(0)
		if err != nil || !slices.Contains(pids, sleeper.Process.Pid) {
			return fmt.Errorf("pids of host 1: %v %v, want %d among them", pids, err, sleeper.Process.Pid)
		}
		return nil
	})
	if n, err := l.KillHost(0); err != nil || n != 1 {
		t.Fatalf("KillHost = %d, %v; want the one sleep killed", n, err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the process of host 1 still runs after KillHost")
	}
	if pids, _ := l.Pids(1); len(pids) != 0 {
		t.Fatalf("host 2 has processes %v", pids)
	}
	names := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	l.Close()
	for _, n := range names {
		if _, err := os.Stat("/run/netns/" + n); err == nil {
			t.Errorf("namespace %s still there after Close", n)
		}
	}
}
