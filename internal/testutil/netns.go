package testutil

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// CanaryConfig says what a canary namespace holds: the addresses of its end of the veth pair
// and the ports it listens on (on every one of its addresses).
type CanaryConfig struct {
	// Addrs are prefixes ("10.20.0.5/24", "169.254.169.254/32") or bare addresses (taken as a
	// single host: /32 or /128) given to the namespace's end. The host routes each prefix to
	// the veth, so a dial from the host (the netstack, the mitm) to one of them reaches the
	// canary and nothing else.
	Addrs []string
	// TCP and UDP are the ports the canary listens on.
	TCP []int
	UDP []int
}

// Arrival is one TCP connection or UDP datagram that reached a canary.
type Arrival struct {
	Network string         // "tcp" or "udp"
	Local   netip.AddrPort // the canary address and port it was sent to
	Remote  netip.AddrPort
	Bytes   int    // bytes read from the connection (or the datagram's size)
	Data    []byte // the first bytes of them (at most 4 KiB)
}

func (a Arrival) String() string {
	return fmt.Sprintf("%s %s from %s (%d bytes)", a.Network, a.Local, a.Remote, a.Bytes)
}

// Canary is a network namespace joined to the host by a veth pair, with listeners that record
// everything that reaches them. Negative egress tests aim at a canary and assert that nothing
// arrived (and which audit rule refused it); positive ones that something did.
//
// A TCP canary reads what the client sends (until the end of a request head, 64 KiB, EOF or
// 3 s), answers "HTTP/1.1 200 OK" with body "canary\n" and closes. A UDP canary echoes each
// datagram. Addresses are machine-wide: a canary takes a lock per address for its lifetime, so
// tests (in any process) that want the same address run one after another.
type Canary struct {
	Name  string       // the namespace (ip netns exec Name ...)
	Addrs []netip.Addr // the namespace's addresses, in the order given

	hostIf  string
	routes  []netip.Prefix
	locks   []*os.File
	lns     []net.Listener
	pcs     []net.PacketConn
	wg      sync.WaitGroup
	mu      sync.Mutex
	arrived []Arrival
}

// canaryReply is what a TCP canary answers.
const canaryReply = "HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\ncanary\n"

// NewCanary creates a canary for t, removed (namespace, veth, host routes) at cleanup. It skips
// t when the test cannot create network namespaces (not root, no ip(8)), and fails it when CI
// is set.
func NewCanary(t testing.TB, cfg CanaryConfig) *Canary {
	t.Helper()
	if err := canaryAvailable(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs network namespaces: %v", err)
		}
		t.Skipf("network namespaces not available: %v", err)
	}
	c, err := StartCanary(cfg)
	if err != nil {
		t.Fatalf("canary: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func canaryAvailable() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("ip(8) not found (apt-get install iproute2)")
	}
	return nil
}

// StartCanary is NewCanary without a testing.TB; the caller must Close it.
func StartCanary(cfg CanaryConfig) (_ *Canary, err error) {
	var prefixes []netip.Prefix
	for _, s := range cfg.Addrs {
		p, err := parseCanaryAddr(s)
		if err != nil {
			return nil, err
		}
		prefixes = append(prefixes, p)
	}
	if len(prefixes) == 0 {
		return nil, errors.New("canary: no addresses")
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	c := &Canary{Name: "nxcanary-" + id, hostIf: "nxch" + id}
	nsIf := "nxcn" + id
	for _, p := range prefixes {
		c.Addrs = append(c.Addrs, p.Addr())
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.lock(); err != nil {
		return nil, err
	}
	ns := func(args ...string) []string { return append([]string{"-n", c.Name}, args...) }
	steps := [][]string{
		{"netns", "add", c.Name},
		{"link", "add", c.hostIf, "type", "veth", "peer", "name", nsIf, "netns", c.Name},
		{"link", "set", c.hostIf, "up"},
		// IPv6 neighbour discovery answers only for an interface's own addresses, so the
		// namespace's way back is a fixed link-local address on the host's end.
		{"-6", "addr", "add", "fe80::1/64", "dev", c.hostIf, "nodad"},
		ns("link", "set", "lo", "up"),
		ns("link", "set", nsIf, "up"),
		ns("route", "add", "default", "dev", nsIf),
		ns("-6", "route", "add", "default", "via", "fe80::1", "dev", nsIf),
	}
	for _, p := range prefixes {
		add := ns("addr", "add", p.String(), "dev", nsIf)
		if p.Addr().Is6() {
			add = append(add, "nodad")
		}
		steps = append(steps, add)
	}
	for _, args := range steps {
		if err := ipCmd(args...); err != nil {
			return nil, err
		}
	}
	for _, p := range prefixes {
		r := p.Masked()
		if err := ipCmd(family(r), "route", "replace", r.String(), "dev", c.hostIf); err != nil {
			return nil, err
		}
		c.routes = append(c.routes, r)
	}
	if err := c.listen(cfg); err != nil {
		return nil, err
	}
	return c, nil
}

func parseCanaryAddr(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("canary address %q: %w", s, err)
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("canary address %q: %w", s, err)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func family(p netip.Prefix) string {
	if p.Addr().Is6() {
		return "-6"
	}
	return "-4"
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// lock takes, in a fixed order, one machine-wide lock per address.
func (c *Canary) lock() error {
	addrs := slices.Clone(c.Addrs)
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	for _, a := range slices.Compact(addrs) {
		name := filepath.Join(os.TempDir(), "nexus-canary-"+strings.ReplaceAll(a.String(), ":", "_")+".lock")
		f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return fmt.Errorf("canary lock: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			return fmt.Errorf("canary lock %s: %w", a, err)
		}
		c.locks = append(c.locks, f)
	}
	return nil
}

// listen opens the listeners inside the namespace: the sockets stay in it whatever thread
// serves them afterwards.
func (c *Canary) listen(cfg CanaryConfig) error {
	return c.inNetns(func() error {
		for _, p := range cfg.TCP {
			ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
			if err != nil {
				return fmt.Errorf("canary listen tcp %d: %w", p, err)
			}
			c.lns = append(c.lns, ln)
		}
		for _, p := range cfg.UDP {
			pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", p))
			if err != nil {
				return fmt.Errorf("canary listen udp %d: %w", p, err)
			}
			c.pcs = append(c.pcs, pc)
		}
		for _, ln := range c.lns {
			c.wg.Add(1)
			go c.serveTCP(ln)
		}
		for _, pc := range c.pcs {
			c.wg.Add(1)
			go c.serveUDP(pc)
		}
		return nil
	})
}

// inNetns runs fn on an OS thread switched into the namespace, then switches it back. If the
// switch back fails the thread is left locked, so the runtime discards it.
func (c *Canary) inNetns(fn func() error) error { return inNetns(c.Name, fn) }

// inNetns runs fn on an OS thread switched into the named namespace (see Canary.inNetns).
func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer self.Close()
		target, err := os.Open(filepath.Join("/run/netns", name))
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("setns back: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func (c *Canary) record(a Arrival) {
	c.mu.Lock()
	c.arrived = append(c.arrived, a)
	c.mu.Unlock()
}

func (c *Canary) serveTCP(ln net.Listener) {
	defer c.wg.Done()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
			var data []byte
			buf := make([]byte, 4096)
			n := 0
			for n < 64<<10 && !bytes.Contains(data, []byte("\r\n\r\n")) {
				k, err := conn.Read(buf)
				n += k
				if room := 4096 - len(data); room > 0 {
					data = append(data, buf[:min(k, room)]...)
				}
				if err != nil {
					break
				}
			}
			c.record(Arrival{Network: "tcp", Local: addrPort(conn.LocalAddr()), Remote: addrPort(conn.RemoteAddr()), Bytes: n, Data: data})
			_, _ = conn.Write([]byte(canaryReply))
		}()
	}
}

func (c *Canary) serveUDP(pc net.PacketConn) {
	defer c.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		// ReadMsgUDP's out-of-band data would tell the destination address; the port is
		// what a test can check without it, so Local holds the unspecified address.
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		c.record(Arrival{Network: "udp", Local: addrPort(pc.LocalAddr()), Remote: addrPort(from), Bytes: n, Data: slices.Clone(buf[:min(n, 4096)])})
		_, _ = pc.WriteTo(buf[:n], from)
	}
}

func addrPort(a net.Addr) netip.AddrPort {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// Arrived returns every connection and datagram that reached the canary so far.
func (c *Canary) Arrived() []Arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.arrived)
}

// RequireNothingArrived fails t, listing them, when anything reached the canary.
func (c *Canary) RequireNothingArrived(t testing.TB) {
	t.Helper()
	if got := c.Arrived(); len(got) > 0 {
		t.Fatalf("canary %s reached: %v", c.Name, got)
	}
}

// Close stops the listeners and removes the host routes, the veth pair and the namespace.
func (c *Canary) Close() {
	for _, ln := range c.lns {
		ln.Close()
	}
	for _, pc := range c.pcs {
		pc.Close()
	}
	c.lns, c.pcs = nil, nil
	c.wg.Wait()
	for _, r := range c.routes {
		_ = ipCmd(family(r), "route", "del", r.String(), "dev", c.hostIf)
	}
	c.routes = nil
	_ = ipCmd("link", "del", c.hostIf) // also removes the namespace's end
	_ = ipCmd("netns", "del", c.Name)
	for _, f := range c.locks {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}
	c.locks = nil
}
