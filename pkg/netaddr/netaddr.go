// Package netaddr classifies destination addresses for the perimeter (DESIGN §5 "Destination
// addresses"): a name's DNS answer, an IP literal and the address the mitm dials are judged as
// well as the name. Loopback, private (RFC 1918), CGNAT, link-local (cloud metadata), IPv6 ULA
// and link-local, 0/8, broadcast, multicast and reserved ranges, and the host's own addresses
// are refused in every mode unless a sandbox names them (--allow-private CIDR). IPv6 forms that
// carry an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4) are judged by the IPv4
// address they carry; Teredo is refused outright.
package netaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Rule is the audit rule of a refusal by address.
const Rule = "private_address"

// ErrPrivate marks a refusal by address.
var ErrPrivate = errors.New("private address")

// special is a non-public range and what it is, as a refusal names it.
type special struct {
	prefix netip.Prefix
	name   string
}

var specials4 = []special{
	{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\" (0/8)"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT (100.64/10)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (cloud metadata)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private (RFC 1918)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private (RFC 1918)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (240/4) or broadcast"},
}

var specials6 = []special{
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("100::/64"), "discard-only (100::/64)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64 (64:ff9b:1::/48)"},
	{netip.MustParsePrefix("2001::/32"), "Teredo (2001::/32)"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (fc00::/7)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local (fe80::/10)"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (fec0::/10)"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// Embedded IPv4 forms: the IPv4 address they carry is what is judged.
var (
	compat4 = netip.MustParsePrefix("::/96")         // IPv4-compatible (deprecated)
	nat64   = netip.MustParsePrefix("64:ff9b::/96")  // RFC 6052 well-known prefix
	sixTo4  = netip.MustParsePrefix("2002::/16")     // RFC 3056
	mapped4 = netip.MustParsePrefix("::ffff:0:0/96") // IPv4-mapped
)

// Embedded returns the IPv4 address an IPv6 address carries (IPv4-mapped, IPv4-compatible,
// NAT64 or 6to4) and how, or ok false.
func Embedded(a netip.Addr) (v4 netip.Addr, form string, ok bool) {
	if !a.Is6() {
		return netip.Addr{}, "", false
	}
	b := a.As16()
	switch {
	case mapped4.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), "IPv4-mapped", true
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), "NAT64", true
	case sixTo4.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), "6to4", true
	case compat4.Contains(a) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback():
		return netip.AddrFrom4([4]byte(b[12:16])), "IPv4-compatible", true
	}
	return netip.Addr{}, "", false
}

// Special names the non-public range a falls in (judging the IPv4 address an IPv6 form
// carries), or "" for a public address. An invalid address is "invalid". The host's own
// addresses are not special here: see Guard.
func Special(a netip.Addr) string {
	if !a.IsValid() {
		return "invalid"
	}
	a = a.WithZone("")
	if v4, form, ok := Embedded(a); ok {
		if s := Special(v4); s != "" {
			return form + " form of " + v4.String() + ", " + s
		}
		return ""
	}
	list := specials6
	if a.Is4() {
		list = specials4
	}
	for _, s := range list {
		if s.prefix.Contains(a) {
			return s.name
		}
	}
	return ""
}

// Guard judges destination addresses for one sandbox: refused when Special or one of the
// host's own, unless inside an allowed private prefix.
type Guard struct {
	allow []netip.Prefix
	host  *HostAddrs
}

// NewGuard returns a guard allowing the given prefixes (already validated by ParseAllowPrivate)
// and refusing the addresses host reports (nil: the machine's, HostAddresses()).
func NewGuard(allow []netip.Prefix, host *HostAddrs) *Guard {
	if host == nil {
		host = HostAddresses()
	}
	return &Guard{allow: allow, host: host}
}

// Check returns nil for an address a sandbox may reach, else a *PrivateError whose text says
// what the address is and how to allow it.
func (g *Guard) Check(a netip.Addr) error {
	a = a.WithZone("")
	if a.Is4In6() {
		a = a.Unmap()
	}
	for _, p := range g.allow {
		if p.Contains(a) {
			return nil
		}
	}
	what := Special(a)
	if what == "" && g.host.Contains(a) {
		what = "an address of this host"
	}
	if what == "" {
		return nil
	}
	return &PrivateError{Addr: a, What: what}
}

// PrivateError is a refusal by address; errors.Is(err, ErrPrivate) holds.
type PrivateError struct {
	Addr netip.Addr
	What string // the range: "private (RFC 1918)", "an address of this host", ...
}

func (e *PrivateError) Error() string {
	return fmt.Sprintf("%s is %s: refused (reach it only with --allow-private CIDR)", e.Addr, e.What)
}

func (e *PrivateError) Is(target error) bool { return target == ErrPrivate }

// ParseAllowPrivate parses --allow-private values: CIDRs (or single addresses) that lie within
// non-public space. A prefix that reaches public addresses (say 0.0.0.0/0, 8.8.8.0/24) is
// refused: the opt-in is for naming a private network, not for lifting the rule.
func ParseAllowPrivate(values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range values {
		v = strings.TrimSpace(v)
		var p netip.Prefix
		var err error
		if strings.Contains(v, "/") {
			p, err = netip.ParsePrefix(v)
		} else {
			var a netip.Addr
			if a, err = netip.ParseAddr(v); err == nil && a.Zone() != "" {
				err = errors.New("zone")
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if err != nil || !p.IsValid() {
			return nil, fmt.Errorf("invalid --allow-private %q: use a CIDR such as 10.20.0.0/16", v)
		}
		p = p.Masked()
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if !withinSpecial(p) {
			return nil, fmt.Errorf("invalid --allow-private %q: it reaches public addresses; name a private range such as 10.20.0.0/16", v)
		}
		out = append(out, p)
	}
	return out, nil
}

// withinSpecial reports whether every address of p is in one special range.
func withinSpecial(p netip.Prefix) bool {
	list := specials6
	if p.Addr().Is4() {
		list = specials4
	}
	for _, s := range list {
		if s.prefix.Bits() <= p.Bits() && s.prefix.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// FormatPrefixes is the inverse of ParseAllowPrivate, for records.
func FormatPrefixes(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// HostAddrs is the set of the host's own interface addresses, re-read at most once per refresh
// interval (interfaces come and go).
type HostAddrs struct {
	mu      sync.Mutex
	read    time.Time
	addrs   map[netip.Addr]struct{}
	refresh time.Duration
	list    func() ([]net.Addr, error)
}

var hostAddrs = &HostAddrs{refresh: 2 * time.Second, list: net.InterfaceAddrs}

// HostAddresses is the machine's own addresses.
func HostAddresses() *HostAddrs { return hostAddrs }

// StaticHostAddrs is a fixed set (tests).
func StaticHostAddrs(addrs ...netip.Addr) *HostAddrs {
	h := &HostAddrs{refresh: time.Duration(1<<63 - 1), read: time.Now(), addrs: map[netip.Addr]struct{}{}}
	for _, a := range addrs {
		h.addrs[a.Unmap()] = struct{}{}
	}
	return h
}

// Contains reports whether a is one of the host's addresses.
func (h *HostAddrs) Contains(a netip.Addr) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.list != nil && (h.addrs == nil || time.Since(h.read) > h.refresh) {
		if list, err := h.list(); err == nil {
			m := make(map[netip.Addr]struct{}, len(list))
			for _, na := range list {
				if ipn, ok := na.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
						m[ip.Unmap()] = struct{}{}
					}
				}
			}
			h.addrs = m
		}
		h.read = time.Now()
	}
	_, ok := h.addrs[a.Unmap()]
	return ok
}
