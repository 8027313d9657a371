package netstack

import (
	"net/netip"

	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/netaddr"
)

// refusedAddr applies the destination address rule (pkg/netaddr) to dst in every mode: a
// non-public address or one of the host's own is refused unless the policy's AllowPrivate names
// it, or it is a resolver override's synthetic address (--resolve host=addr: the explicit
// allowance of exactly that host and address). On refusal it fills ev and reports true.
func (n *network) refusedAddr(pol Policy, dst netip.Addr, ev *audit.Event) bool {
	if _, ok := n.svc.overrides.byIP[dst]; ok {
		return false
	}
	err := guardOf(pol).Check(dst)
	if err == nil {
		return false
	}
	ev.Decision, ev.Rule, ev.Reason = audit.Deny, netaddr.Rule, err.Error()
	return true
}

// guardOf builds the address guard of a policy; its AllowPrivate was validated by
// normalizePolicy, so nothing fails here (a few prefixes: cheaper than any cache).
func guardOf(pol Policy) *netaddr.Guard {
	allow, _ := netaddr.ParseAllowPrivate(pol.AllowPrivate)
	return netaddr.NewGuard(allow, nil)
}
