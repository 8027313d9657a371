package testutil

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Listener is a listening TCP socket (or a bound UDP one) of a process.
type Listener struct {
	Network string // "tcp", "tcp6", "udp", "udp6"
	Addr    netip.AddrPort
}

// Listeners returns the listening TCP and bound UDP sockets that process pid holds open, read
// from /proc/<pid>/fd and /proc/<pid>/net (so a test can assert what a stack exposes).
func Listeners(pid int) ([]Listener, error) {
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []Listener
	for _, netw := range []string{"tcp", "tcp6", "udp", "udp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, netw))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			// TCP_LISTEN is 0A; a UDP socket counts when bound (it receives on any state 07).
			if strings.HasPrefix(netw, "tcp") && fs[3] != "0A" {
				continue
			}
			ap, err := parseProcAddr(fs[1])
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("/proc/%d/net/%s: %q: %w", pid, netw, fs[1], err)
			}
			out = append(out, Listener{Network: netw, Addr: ap})
		}
		f.Close()
	}
	return out, nil
}

// parseProcAddr parses /proc/net/tcp's "0100007F:1F90": the address in 32-bit words of host
// byte order (little-endian here), the port in hex.
func parseProcAddr(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("no port")
	}
	b, err := hex.DecodeString(h)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.AddrPort{}, fmt.Errorf("bad address")
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), nil
}
