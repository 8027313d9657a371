package netstack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/policy"
)

// TTL bounds for answers given to the guest: a floor avoids re-resolving on every connection, a
// ceiling keeps the name table fresh.
const (
	minAnswerTTL      = 5
	maxAnswerTTL      = 300
	overrideAnswerTTL = 60
)

// serveDNS answers one guest query at the gateway.
func (n *network) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	proto := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		proto = "tcp"
	}
	ev := audit.Event{Layer: audit.LayerDNS, Proto: proto, IP: GatewayIP, Port: 53, Decision: audit.Deny}
	if !n.budget.dns.Allow() {
		n.refuseDNS(w, req, ev)
		return
	}
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true
	reply := func(rcode int) {
		m.Rcode = rcode
		_ = w.WriteMsg(m)
		n.dnsUDP.answered(w.RemoteAddr())
		n.emit(ev)
	}
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 || req.Response {
		ev.Reason = "malformed query"
		m.Question = nil
		reply(dns.RcodeFormatError)
		return
	}
	q := req.Question[0]
	qtype := dns.TypeToString[q.Qtype]
	if qtype == "" {
		qtype = fmt.Sprintf("TYPE%d", q.Qtype)
	}
	name, err := policy.NormalizeHost(q.Name)
	ev.Host = strings.ToLower(strings.TrimSuffix(q.Name, "."))
	if len(ev.Host) > 253 {
		ev.Host = ev.Host[:253]
	}
	now := time.Now()
	pol, allow := n.policy()
	mode := effectiveMode(pol, now)
	if mode == netstackapi.ModeNone {
		ev.Reason = "egress mode none: dns refused"
		reply(dns.RcodeRefused)
		return
	}
	if err != nil || q.Qclass != dns.ClassINET {
		ev.Reason = "not a valid internet host name"
		reply(dns.RcodeNameError)
		return
	}
	ev.Host = name
	if mode == netstackapi.ModeAllowAll {
		ev.Decision, ev.Rule = audit.Allow, ruleAllowAll
	} else if r, ok := allow.MatchName(name); ok {
		ev.Decision, ev.Rule = audit.Allow, r.String()
	} else if d, denied := allow.Denied(name); denied {
		ev.Rule, ev.Reason = policy.RuleDenied, "name is denied ("+d+", nexus egress deny)"
		reply(dns.RcodeNameError)
		return
	} else if pol.Ask {
		src := guestSocket{proto: proto}
		if ap, err := netip.ParseAddrPort(w.RemoteAddr().String()); err == nil {
			src.port = int(ap.Port())
		}
		out := n.holdForApproval(&n.held.dns, MaxHeld, name, 0, src, AskHold, func() bool {
			_, allow = n.policy()
			_, ok := allow.MatchName(name)
			return ok
		})
		if out != askApproved {
			ev.Rule, ev.Reason = out.rule(), "name is not on the allowlist; "+out.reason()
			reply(dns.RcodeServerFailure)
			return
		}
		r, _ := allow.MatchName(name) // approved while held
		ev.Decision, ev.Rule = audit.Allow, r.String()
	} else {
		ev.Reason = "name is not on the allowlist"
		reply(dns.RcodeNameError)
		return
	}
	switch q.Qtype {
	case dns.TypeA:
	case dns.TypeAAAA:
		ev.Reason = "AAAA " + "not answered: the sandbox network is IPv4 only"
		reply(dns.RcodeSuccess)
		return
	default:
		ev.Reason = qtype + " not answered: only A records are served"
		reply(dns.RcodeSuccess)
		return
	}
	ips, ttl, rcode, err := n.resolveA(name)
	if err != nil {
		ev.Reason = "upstream resolve failed: " + err.Error()
		reply(dns.RcodeServerFailure)
		return
	}
	if rcode != dns.RcodeSuccess {
		ev.Reason = "upstream answered " + dns.RcodeToString[rcode]
		reply(rcode)
		return
	}
	if _, override := n.svc.overrides.byName[name]; !override {
		for _, ip := range ips {
			if n.refusedAddr(pol, ip, &ev) {
				// DNS rebinding: an allowed name may not lead to the host, the LAN or metadata.
				// The answer is not handed over (nor recorded): the guest gets REFUSED.
				ev.Reason = "answer " + ev.Reason
				reply(dns.RcodeRefused)
				return
			}
		}
	}
	n.table.record(name, ips, ttl, now)
	parts := make([]string, 0, len(ips))
	for _, ip := range ips {
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: uint32(ttl)},
			A:   net.IP(ip.AsSlice()),
		})
		if len(parts) < 8 {
			parts = append(parts, ip.String())
		}
	}
	ev.Reason = fmt.Sprintf("answered %s ttl %d", strings.Join(parts, " "), ttl)
	if len(ips) == 0 {
		ev.Reason = "upstream has no A record"
	}
	reply(dns.RcodeSuccess)
}

// resolveA resolves name's A records: a resolver override or the upstream resolver. The TTL is
// the smallest of the answer, clamped to [minAnswerTTL, maxAnswerTTL].
func (n *network) resolveA(name string) ([]netip.Addr, int, int, error) {
	if ip, ok := n.svc.overrides.byName[name]; ok {
		return []netip.Addr{ip}, overrideAnswerTTL, dns.RcodeSuccess, nil
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	q.RecursionDesired = true
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	resp, _, err := n.svc.dnsClient.ExchangeContext(ctx, q, n.svc.cfg.UpstreamDNS)
	if err == nil && resp.Truncated {
		tc := *n.svc.dnsClient
		tc.Net = "tcp"
		resp, _, err = tc.ExchangeContext(ctx, q, n.svc.cfg.UpstreamDNS)
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%s", dialErrText(err))
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, 0, resp.Rcode, nil
	}
	var ips []netip.Addr
	ttl := maxAnswerTTL
	for _, rr := range resp.Answer {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.A.To4())
		if !ok {
			continue
		}
		ips = append(ips, ip)
		ttl = min(ttl, int(a.Hdr.Ttl))
		if len(ips) == 32 {
			break
		}
	}
	return ips, max(ttl, minAnswerTTL), dns.RcodeSuccess, nil
}
