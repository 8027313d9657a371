package netstack

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/time/rate"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bytesize"
)

// Audit rules of the egress budgets (netstackapi.Limits), one event per rule and limitWindow
// with the count of hits in its reason.
const (
	RuleMaxConns         = "max_conns"         // a new flow past the concurrent-connection cap: refused
	RuleConnRate         = "conn_rate"         // a new flow past the connections-per-second bucket: refused
	RuleDNSRate          = "dns_rate"          // a query past the queries-per-second bucket: REFUSED
	RuleEgressBandwidth  = "egress_bandwidth"  // a write out past the bandwidth bucket: delayed (allow)
	RuleIngressBandwidth = "ingress_bandwidth" // a write to the guest past its bucket: delayed (allow)
)

// limitWindow is how often hits of one budget are audited.
const limitWindow = time.Second

// budget is one network's egress budgets: token buckets for new flows, DNS queries, bytes sent
// and bytes received, and a count of open flows.
type budget struct {
	lim     atomic.Pointer[netstackapi.Limits] // with defaults; replaced by setLimits
	open    atomic.Int64                       // flows admitted and not yet ended
	flows   *rate.Limiter
	dns     *rate.Limiter
	egress  *rate.Limiter
	ingress *rate.Limiter
	limited atomic.Uint64

	mu   sync.Mutex
	hits map[string]*limitHits // by rule, for the window under way
}

// limitHits are one budget's hits in a window: the first one's event and how many.
type limitHits struct {
	ev    audit.Event
	count int
	bytes int64
}

func newBudget(l netstackapi.Limits) *budget {
	l = l.WithDefaults()
	b := &budget{
		flows:   rate.NewLimiter(rate.Limit(l.ConnRate), l.ConnRate),
		dns:     rate.NewLimiter(rate.Limit(l.DNSRate), l.DNSRate),
		egress:  rate.NewLimiter(rate.Limit(l.EgressBandwidth), egressBurst(l.EgressBandwidth)),
		ingress: rate.NewLimiter(rate.Limit(l.IngressBandwidth), egressBurst(l.IngressBandwidth)),
		hits:    map[string]*limitHits{},
	}
	b.lim.Store(&l)
	return b
}

// limits are the budgets in force.
func (b *budget) limits() netstackapi.Limits { return *b.lim.Load() }

// setLimits replaces the budgets of a running network: the buckets keep their tokens up to the
// new burst; open flows past a lower MaxConns stay open, new ones wait for the count to drop.
func (b *budget) setLimits(l netstackapi.Limits) {
	l = l.WithDefaults()
	b.lim.Store(&l)
	b.flows.SetLimit(rate.Limit(l.ConnRate))
	b.flows.SetBurst(l.ConnRate)
	b.dns.SetLimit(rate.Limit(l.DNSRate))
	b.dns.SetBurst(l.DNSRate)
	b.egress.SetLimit(rate.Limit(l.EgressBandwidth))
	b.egress.SetBurst(egressBurst(l.EgressBandwidth))
	b.ingress.SetLimit(rate.Limit(l.IngressBandwidth))
	b.ingress.SetBurst(egressBurst(l.IngressBandwidth))
}

// egressBurst is a tenth of a second's worth of bytes, and at least one 64 KiB write (the
// largest a splice or a datagram makes at once).
func egressBurst(bps int64) int { return int(max(bps/10, 64<<10)) }

// admit claims a slot for a new flow the judge allowed: false, with the hit audited, when the
// sandbox has MaxConns flows open or no ConnRate token left. Every true must be released.
func (n *network) admit(v verdict) bool {
	b := n.budget
	rule := ""
	if b.open.Add(1) > int64(b.limits().MaxConns) {
		rule = RuleMaxConns
	} else if !b.flows.Allow() {
		rule = RuleConnRate
	}
	if rule == "" {
		return true
	}
	b.open.Add(-1)
	n.limitHit(rule, audit.Event{Layer: v.ev.Layer, Proto: v.ev.Proto}, 0)
	return false
}

func (n *network) release() { n.budget.open.Add(-1) }

// refuseDNS answers a query past the DNS budget with REFUSED.
func (n *network) refuseDNS(w dns.ResponseWriter, req *dns.Msg, ev audit.Event) {
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeRefused)
	_ = w.WriteMsg(m)
	n.dnsUDP.answered(w.RemoteAddr())
	n.limitHit(RuleDNSRate, audit.Event{Layer: ev.Layer, Proto: ev.Proto, IP: ev.IP, Port: ev.Port}, 0)
}

// waitEgress holds a write of k bytes (k ≤ the burst) out to the egress bandwidth budget.
func (n *network) waitEgress(k int, proto string) error {
	return n.waitBytes(n.budget.egress, RuleEgressBandwidth, k, proto)
}

// waitIngress holds a write of k bytes (k ≤ the burst) to the guest to the ingress budget.
func (n *network) waitIngress(k int, proto string) error {
	return n.waitBytes(n.budget.ingress, RuleIngressBandwidth, k, proto)
}

// waitBytes holds a write of k bytes (k ≤ the burst) to bucket l, counting a delay under rule.
func (n *network) waitBytes(l *rate.Limiter, rule string, k int, proto string) error {
	r := l.ReserveN(time.Now(), k)
	if !r.OK() {
		return errors.New("write larger than the bandwidth burst")
	}
	d := r.Delay()
	if d <= 0 {
		return nil
	}
	n.limitHit(rule, audit.Event{Layer: audit.LayerL4, Proto: proto}, int64(k))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-n.ctx.Done():
		r.Cancel()
		return n.ctx.Err()
	}
}

// egressWriter is a flow's upstream side held to the sandbox's egress bandwidth.
type egressWriter struct {
	n *network
	w io.Writer
}

func (e egressWriter) Write(p []byte) (int, error) {
	return e.n.writeHeld(e.w, p, e.n.budget.egress, RuleEgressBandwidth)
}

// ingressWriter is a flow's guest side held to the sandbox's ingress bandwidth.
type ingressWriter struct {
	n *network
	w io.Writer
}

func (i ingressWriter) Write(p []byte) (int, error) {
	return i.n.writeHeld(i.w, p, i.n.budget.ingress, RuleIngressBandwidth)
}

// writeHeld writes p to w in bursts of bucket l, each waiting for its tokens.
func (n *network) writeHeld(w io.Writer, p []byte, l *rate.Limiter, rule string) (int, error) {
	written := 0
	for len(p) > 0 {
		k := min(len(p), l.Burst())
		if err := n.waitBytes(l, rule, k, "tcp"); err != nil {
			return written, err
		}
		m, err := w.Write(p[:k])
		written += m
		if err != nil {
			return written, err
		}
		p = p[k:]
	}
	return written, nil
}

// limitHit counts one hit of a budget; the first of a window schedules the window's event.
func (n *network) limitHit(rule string, ev audit.Event, bytes int64) {
	b := n.budget
	b.limited.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.hits[rule]
	if h == nil {
		h = &limitHits{ev: ev}
		b.hits[rule] = h
		time.AfterFunc(limitWindow, func() { n.flushLimit(rule) })
	}
	h.count++
	h.bytes += bytes
}

// flushLimit audits the window of one budget's hits, if any.
func (n *network) flushLimit(rule string) {
	b := n.budget
	b.mu.Lock()
	h := b.hits[rule]
	delete(b.hits, rule)
	b.mu.Unlock()
	if h == nil {
		return
	}
	ev := h.ev
	ev.Decision, ev.Rule = audit.Deny, rule
	lim := b.limits()
	switch rule {
	case RuleMaxConns:
		ev.Reason = fmt.Sprintf("%d new connections refused in %s: %d open at once is the sandbox's limit (--max-conns)", h.count, limitWindow, lim.MaxConns)
	case RuleConnRate:
		ev.Reason = fmt.Sprintf("%d new connections refused in %s: over %d per second (--conn-rate)", h.count, limitWindow, lim.ConnRate)
	case RuleDNSRate:
		ev.Reason = fmt.Sprintf("%d dns queries refused in %s: over %d per second (--dns-rate)", h.count, limitWindow, lim.DNSRate)
	case RuleEgressBandwidth:
		ev.Decision, ev.Bytes = audit.Allow, h.bytes
		ev.Reason = fmt.Sprintf("%d writes delayed in %s: egress is held to %s per second (--egress-bandwidth)", h.count, limitWindow, sizeText(lim.EgressBandwidth))
	case RuleIngressBandwidth:
		ev.Decision, ev.Bytes = audit.Allow, h.bytes
		ev.Reason = fmt.Sprintf("%d writes to the guest delayed in %s: ingress is held to %s per second (--ingress-bandwidth)", h.count, limitWindow, sizeText(lim.IngressBandwidth))
	}
	n.emit(ev)
}

// flushLimits audits every window under way (the network is closing).
func (n *network) flushLimits() {
	for _, rule := range []string{RuleMaxConns, RuleConnRate, RuleDNSRate, RuleEgressBandwidth, RuleIngressBandwidth} {
		n.flushLimit(rule)
	}
}

// sizeText writes a byte count in the largest binary unit that divides it.
func sizeText(b int64) string {
	for _, u := range []struct {
		n    int64
		unit string
	}{{bytesize.GiB, "GiB"}, {bytesize.MiB, "MiB"}, {bytesize.KiB, "KiB"}} {
		if b >= u.n && b%u.n == 0 {
			return fmt.Sprintf("%d %s", b/u.n, u.unit)
		}
	}
	return fmt.Sprintf("%d bytes", b)
}
