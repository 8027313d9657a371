package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// LAN is a private bridge with network namespaces on it, one per simulated host: each has a
// veth pair to the bridge, its own loopback and one address of a private /24. The bridge has no
// address in the test's namespace, so traffic between the hosts stays on it and nothing of it
// reaches this machine's network. Stacks run in a host with StackOptions.Netns.
type LAN struct {
	Bridge string
	Hosts  []LANHost
	veths  []string
}

// LANHost is one namespace of a LAN.
type LANHost struct {
	Netns string     // ip netns name
	Addr  netip.Addr // its address on the bridge
}

// lanNet is the /24 of every LAN: LANs are separate bridges, so two at once do not meet.
const lanNet = "10.213.0."

// NewLAN creates a LAN of n hosts (addresses 10.213.0.1…n) for t. At cleanup, and shortly
// before t's deadline (a package about to run out of -timeout runs no cleanup), every process
// left in its namespaces (nexus, QEMU) is killed and the namespaces and bridge are removed. It
// skips t without root or ip(8), and fails it when CI is set.
func NewLAN(t testing.TB, n int) *LAN {
	t.Helper()
	if err := lanAvailable(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs network namespaces: %v", err)
		}
		t.Skipf("network namespaces not available: %v", err)
	}
	l, err := StartLAN(n)
	if err != nil {
		t.Fatalf("lan: %v", err)
	}
	t.Cleanup(l.Close)
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok && time.Until(dl) > 2*timeoutMargin {
			w := time.AfterFunc(time.Until(dl)-timeoutMargin, func() {
				fmt.Fprintf(os.Stderr, "lan: the test is %v from its deadline: killing every process of its hosts\n", timeoutMargin)
				l.Close()
			})
			t.Cleanup(func() { w.Stop() })
		}
	}
	return l
}

func lanAvailable() error {
	if err := canaryAvailable(); err != nil {
		return err
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		return errors.New("nsenter(1) not found (apt-get install util-linux)")
	}
	return nil
}

// StartLAN is NewLAN without a testing.TB; the caller must Close it.
func StartLAN(n int) (_ *LAN, err error) {
	var b [3]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	l := &LAN{Bridge: "nxlb" + id}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := ipCmd("link", "add", l.Bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	if err := ipCmd("link", "set", l.Bridge, "up"); err != nil {
		return nil, err
	}
	for i := 1; i <= n; i++ {
		h := LANHost{Netns: fmt.Sprintf("nxlan-%s-%d", id, i), Addr: netip.MustParseAddr(lanNet + strconv.Itoa(i))}
		veth := fmt.Sprintf("nxl%sh%d", id, i)
		steps := [][]string{
			{"netns", "add", h.Netns},
			{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.Netns},
			{"link", "set", veth, "master", l.Bridge, "up"},
			{"-n", h.Netns, "link", "set", "lo", "up"},
			{"-n", h.Netns, "addr", "add", h.Addr.String() + "/24", "dev", "eth0"},
			{"-n", h.Netns, "link", "set", "eth0", "up"},
		}
		for j, args := range steps {
			if err := ipCmd(args...); err != nil {
				return nil, err
			}
			switch j {
			case 0:
				l.Hosts = append(l.Hosts, h)
			case 1:
				l.veths = append(l.veths, veth)
			}
		}
	}
	return l, nil
}

// Pids are the processes in host i's namespace (0-based).
func (l *LAN) Pids(i int) ([]int, error) { return netnsPids(l.Hosts[i].Netns) }

// KillHost kills (SIGKILL) every process in host i's namespace, as a host that loses power,
// and waits until none is left. It returns how many it killed.
func (l *LAN) KillHost(i int) (int, error) {
	killed := map[int]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids, err := l.Pids(i)
		if err != nil {
			return len(killed), err
		}
		if len(pids) == 0 {
			return len(killed), nil
		}
		if time.Now().After(deadline) {
			return len(killed), fmt.Errorf("host %s: processes %v left 30s after SIGKILL", l.Hosts[i].Netns, pids)
		}
		for _, p := range pids {
			if syscall.Kill(p, syscall.SIGKILL) == nil {
				killed[p] = true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close kills every process left in the namespaces and removes them, their veths and the
// bridge.
func (l *LAN) Close() {
	for i, h := range l.Hosts {
		_, _ = l.KillHost(i)
		_ = ipCmd("netns", "del", h.Netns)
	}
	for _, v := range l.veths {
		_ = ipCmd("link", "del", v)
	}
	_ = ipCmd("link", "del", l.Bridge)
	l.Hosts, l.veths = nil, nil
}

// netnsPids are the processes whose network namespace is the named one (what `ip netns pids`
// prints), found through /proc.
func netnsPids(name string) ([]int, error) {
	var want unix.Stat_t
	if err := unix.Stat(filepath.Join("/run/netns", name), &want); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("netns %s: %w", name, err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) != nil {
			continue // gone meanwhile
		}
		if st.Dev == want.Dev && st.Ino == want.Ino {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// InHost runs fn on an OS thread switched into host i's namespace: a socket it opens stays
// there.
func (l *LAN) InHost(i int, fn func() error) error { return inNetns(l.Hosts[i].Netns, fn) }

// String is the LAN's hosts and addresses, for a test log.
func (l *LAN) String() string {
	var parts []string
	for _, h := range l.Hosts {
		parts = append(parts, h.Netns+"="+h.Addr.String())
	}
	return l.Bridge + ": " + strings.Join(parts, " ")
}
