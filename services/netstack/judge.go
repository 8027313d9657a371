package netstack

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/policy"
)

// Rule names for decisions that are not an allowlist rule.
const (
	ruleAllowAll = "allow-all"
	ruleGateway  = "gateway"
)

// verdict is a judged TCP/UDP/ICMP flow.
type verdict struct {
	ev     audit.Event
	target string // dial address (host:port) when allowed
	shim   bool   // curated 443/80: SNI→CONNECT shim
	ask    bool   // refused only for want of a rule: an ask-mode network holds it (ask.go)
}

func (v verdict) allowed() bool { return v.ev.Decision == audit.Allow }

// namesFor returns the allowed-or-not names behind dst: override names and DNS answers.
func (n *network) namesFor(dst netip.Addr, now time.Time) []string {
	names := n.table.namesFor(dst, now, n.svc.cfg.DNSGrace)
	if ov, ok := n.svc.overrides.byIP[dst]; ok && len(names) == 0 {
		names = []string{ov.name}
	}
	return names
}

// judgeTCP decides a guest SYN to dst:port; names are those behind dst (namesFor).
func (n *network) judgeTCP(dst netip.Addr, port int, names []string) verdict {
	now := time.Now()
	pol, allow := n.policy()
	v := verdict{ev: audit.Event{Layer: audit.LayerL4, Proto: "tcp", IP: dst.String(), Port: port, Decision: audit.Deny}}
	if len(names) > 0 {
		v.ev.Host = names[0]
	}
	mode := effectiveMode(pol, now)
	switch {
	case mode == netstackapi.ModeNone:
		v.ev.Reason = "egress mode none: nothing leaves the sandbox"
		return v
	case dst == gatewayAddr:
		v.ev.Reason = "the gateway serves only dns on port 53"
		return v
	case port == 53:
		v.ev.Layer = audit.LayerDNS
		v.ev.Reason = "dns goes only to the gateway resolver " + GatewayIP
		return v
	case n.refusedAddr(pol, dst, &v.ev):
		return v
	case !dst.Is4() || dst.IsLoopback() || dst.IsUnspecified() || dst.IsMulticast():
		v.ev.Reason = "destination is not routable from the sandbox"
		return v
	case mode == netstackapi.ModeAllowAll:
		v.ev.Decision, v.ev.Rule = audit.Allow, ruleAllowAll
		v.ev.Reason = "egress mode allow-all until " + pol.AllowAllUntil.UTC().Format(time.RFC3339)
		v.target = n.svc.overrides.target(dst, port)
		return v
	}
	for _, name := range names {
		if r, ok := allow.Match(name, port); ok {
			v.ev.Decision, v.ev.Host, v.ev.Rule = audit.Allow, name, r.String()
			v.ev.Reason = "ip resolved from allowed name " + name
			v.target = n.svc.overrides.target(dst, port)
			v.shim = port == 443 || port == 80
			return v
		}
	}
	if r, ok := allow.MatchAddr(dst, port); ok {
		v.ev.Decision, v.ev.Rule, v.ev.Reason = audit.Allow, r.String(), "ip literal on the allowlist"
		v.target = n.svc.overrides.target(dst, port)
		return v
	}
	for _, name := range append(slices.Clip(names), dst.String()) {
		if d, denied := allow.Denied(name); denied {
			v.ev.Host, v.ev.Rule, v.ev.Reason = name, policy.RuleDenied, "host is denied ("+d+", nexus egress deny)"
			return v
		}
	}
	v.ask = pol.Ask
	if len(names) == 0 {
		v.ev.Reason = "ip was not resolved from an allowed name"
	} else {
		v.ev.Reason = fmt.Sprintf("port %d is not allowed for %s", port, strings.Join(names, ", "))
	}
	return v
}

// judgeUDP decides a guest datagram to dst:port that no gateway service took (DNS to the gateway
// and DHCP never get here); names are those behind dst (namesFor).
func (n *network) judgeUDP(dst netip.Addr, port int, names []string) verdict {
	now := time.Now()
	pol, _ := n.policy()
	v := verdict{ev: audit.Event{Layer: audit.LayerL4, Proto: "udp", IP: dst.String(), Port: port, Decision: audit.Deny}}
	if len(names) > 0 {
		v.ev.Host = names[0]
	}
	mode := effectiveMode(pol, now)
	switch {
	case mode == netstackapi.ModeNone:
		v.ev.Reason = "egress mode none: nothing leaves the sandbox"
	case port == 53 && dst != gatewayAddr:
		v.ev.Layer = audit.LayerDNS
		v.ev.Reason = "dns goes only to the gateway resolver " + GatewayIP
	case dst == gatewayAddr:
		v.ev.Reason = "the gateway serves only dns on port 53"
	case mode == netstackapi.ModeAllowAll && n.refusedAddr(pol, dst, &v.ev):
	case mode == netstackapi.ModeAllowAll && dst.Is4() && !dst.IsLoopback() && !dst.IsMulticast() && !dst.IsUnspecified() && dst != netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		v.ev.Decision, v.ev.Rule = audit.Allow, ruleAllowAll
		v.ev.Reason = "egress mode allow-all until " + pol.AllowAllUntil.UTC().Format(time.RFC3339)
		v.target = n.svc.overrides.target(dst, port)
	default:
		v.ev.Reason = "udp is allowed only for dns to the gateway"
	}
	return v
}

// judgeICMP decides an echo request; allowed echoes are answered by the gateway itself.
func (n *network) judgeICMP(dst netip.Addr) bool {
	now := time.Now()
	pol, allow := n.policy()
	ev := audit.Event{Layer: audit.LayerL4, Proto: "icmp", IP: dst.String(), Decision: audit.Deny}
	names := n.namesFor(dst, now)
	if len(names) > 0 {
		ev.Host = names[0]
	}
	mode := effectiveMode(pol, now)
	switch {
	case dst == gatewayAddr:
		ev.Decision, ev.Rule, ev.Reason = audit.Allow, ruleGateway, "echo answered by the gateway"
	case mode == netstackapi.ModeNone:
		ev.Reason = "egress mode none: nothing leaves the sandbox"
	case mode == netstackapi.ModeAllowAll:
		ev.Decision, ev.Rule, ev.Reason = audit.Allow, ruleAllowAll, "echo answered by the gateway (allow-all)"
	default:
		ev.Reason = "ip was not resolved from an allowed name"
		for _, name := range names {
			if r, ok := allow.MatchName(name); ok {
				ev.Decision, ev.Host, ev.Rule = audit.Allow, name, r.String()
				ev.Reason = "echo answered by the gateway for allowed name " + name
				break
			}
		}
	}
	n.emit(ev)
	return ev.Decision == audit.Allow
}

func countersOf(n *network) netstackapi.Counters {
	c := netstackapi.Counters{Allowed: n.allowed.Load(), Denied: n.denied.Load(), Flows: n.conns.len(), Limited: n.budget.limited.Load()}
	if n.stack != nil {
		if nic, ok := n.stack.NICInfo()[nicID]; ok {
			// The NIC's receive side is what the guest sent out.
			c.BytesOut, c.BytesIn = nic.Stats.Rx.Bytes.Value(), nic.Stats.Tx.Bytes.Value()
		}
	}
	return c
}
