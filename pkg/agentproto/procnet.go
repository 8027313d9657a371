package agentproto

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
)

// maxProcNetLines bounds how many socket lines ParseProcNetTCP looks at.
const maxProcNetLines = 1 << 16

// ParseProcNetTCP returns the listening sockets (state 0A) in the text of /proc/net/tcp
// (proto "tcp") or /proc/net/tcp6 (proto "tcp6"). Kernel addresses are 32-bit words in host byte
// order; this reads them as little-endian, as on every architecture nexus guests run on.
// Malformed lines are skipped; duplicates (SO_REUSEPORT) are reported once.
func ParseProcNetTCP(data []byte, proto string) ([]Listener, error) {
	if proto != "tcp" && proto != "tcp6" {
		return nil, fmt.Errorf("parse proc net: unknown proto %q", proto)
	}
	var out []Listener
	seen := map[Listener]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 512), 4096)
	lines := 0
	for sc.Scan() {
		lines++
		if lines == 1 {
			continue // header
		}
		if lines > maxProcNetLines {
			break
		}
		f := bytes.Fields(sc.Bytes())
		if len(f) < 4 || !bytes.Equal(f[3], []byte("0A")) {
			continue
		}
		ip, port, ok := parseHexAddr(f[1], proto == "tcp6")
		if !ok {
			continue
		}
		l := Listener{Proto: proto, IP: ip.String(), Port: port}
		if !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("parse proc net: %w", err)
	}
	return out, nil
}

// parseHexAddr parses "0100007F:1F90" (tcp) or 32 hex digits ":" port (tcp6).
func parseHexAddr(b []byte, v6 bool) (netip.Addr, uint16, bool) {
	i := bytes.IndexByte(b, ':')
	if i < 0 {
		return netip.Addr{}, 0, false
	}
	hexIP, hexPort := b[:i], b[i+1:]
	if len(hexPort) != 4 {
		return netip.Addr{}, 0, false
	}
	p, err := strconv.ParseUint(string(hexPort), 16, 16)
	if err != nil {
		return netip.Addr{}, 0, false
	}
	want := 8
	if v6 {
		want = 32
	}
	if len(hexIP) != want {
		return netip.Addr{}, 0, false
	}
	raw := make([]byte, want/2)
	if _, err := hex.Decode(raw, hexIP); err != nil {
		return netip.Addr{}, 0, false
	}
	// Each 32-bit word is printed in host (little-endian) order: reverse its bytes.
	for w := 0; w+4 <= len(raw); w += 4 {
		raw[w], raw[w+1], raw[w+2], raw[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	ip, ok := netip.AddrFromSlice(raw)
	if !ok {
		return netip.Addr{}, 0, false
	}
	return ip.Unmap(), uint16(p), true
}

// SocketInode returns the inode of the socket whose local port is port in the text of
// /proc/net/{tcp,udp} (IPv4 or IPv6, any state), or 0 when none has it.
func SocketInode(data []byte, port uint16) uint64 {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 512), 4096)
	for lines := 0; sc.Scan() && lines < maxProcNetLines; lines++ {
		if lines == 0 {
			continue // header
		}
		f := bytes.Fields(sc.Bytes())
		if len(f) < 10 {
			continue
		}
		_, p, ok := parseHexAddr(f[1], len(f[1]) > 13)
		if !ok || p != port {
			continue
		}
		if ino, err := strconv.ParseUint(string(f[9]), 10, 64); err == nil && ino != 0 {
			return ino
		}
	}
	return 0
}
