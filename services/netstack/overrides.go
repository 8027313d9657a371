package netstack

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/IniZio/nexus/pkg/policy"
)

// syntheticBase is the first address handed out for resolver overrides (RFC 2544 benchmarking
// range, never routed on the internet).
var syntheticBase = netip.MustParseAddr("198.18.0.1")

// overrides maps test host names to synthetic IPs and synthetic IPs to real dial targets.
type overrides struct {
	byName map[string]netip.Addr
	byIP   map[netip.Addr]override
}

type override struct {
	name string
	addr netip.Addr // real address
	port int        // 0: keep the guest's destination port
}

func newOverrides(m map[string]string) (*overrides, error) {
	o := &overrides{byName: map[string]netip.Addr{}, byIP: map[netip.Addr]override{}}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	ip := syntheticBase
	for _, raw := range names {
		name, err := policy.NormalizeHost(raw)
		if err != nil {
			return nil, fmt.Errorf("resolver override %q: %w", raw, err)
		}
		ov := override{name: name}
		target := m[raw]
		if ap, err := netip.ParseAddrPort(target); err == nil {
			ov.addr, ov.port = ap.Addr(), int(ap.Port())
		} else if a, err := netip.ParseAddr(target); err == nil {
			ov.addr = a
		} else {
			return nil, fmt.Errorf("resolver override %s=%q: want ip or ip:port", raw, target)
		}
		if _, dup := o.byName[name]; dup {
			return nil, fmt.Errorf("resolver override %s given twice", name)
		}
		o.byName[name] = ip
		o.byIP[ip] = ov
		ip = ip.Next()
	}
	return o, nil
}

// target returns where a connection to dst:port really goes.
func (o *overrides) target(dst netip.Addr, port int) string {
	if ov, ok := o.byIP[dst]; ok {
		if ov.port != 0 {
			port = ov.port
		}
		return net.JoinHostPort(ov.addr.String(), fmt.Sprint(port))
	}
	return net.JoinHostPort(dst.String(), fmt.Sprint(port))
}
