package netstack

import (
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
)

// Audit rules of open connections closed because the policy no longer allows them. Each closed
// connection is one deny event with one of these rules and the new judge's reason.
const (
	// RuleAllowAllExpired: the allow-all window ended while the connection was open.
	RuleAllowAllExpired = "allow_all_expired"
	// RulePolicyRevoked: a policy update (UpdateNetwork) no longer allows the connection.
	RulePolicyRevoked = "policy_revoked"
)

// flow is one forwarded TCP connection or UDP flow in a network's connection table: what it was
// judged for at its start, so a policy change can judge it again with the same judge.
type flow struct {
	proto string // tcp or udp
	dst   netip.Addr
	port  int
	names []string // names behind dst when it was judged
	shim  bool     // relayed to the mitm (curated 443/80)
	sni   string   // the SNI/Host the shim checked (shim only)
	layer string   // layer of its audit events
	epoch uint64   // conntrack epoch before it was judged

	closers []io.Closer // guest and upstream sides
	cut     func()      // aborts the guest side (RST) when set
	bytes   atomic.Int64
	once    sync.Once
	revoked atomic.Bool // closed by a re-judge (audited once)
}

// close ends the flow: the guest side is reset, the upstream side (the real host or the mitm
// tunnel) closed.
func (f *flow) close() {
	f.once.Do(func() {
		if f.cut != nil {
			f.cut()
		}
		for _, c := range f.closers {
			c.Close()
		}
	})
}

// conntrack is a network's table of open flows.
type conntrack struct {
	// epoch counts re-judging sweeps; a flow judged in an earlier epoch than the one it joins the
	// table in is judged again at once (the sweep may have missed it).
	epoch atomic.Uint64

	mu     sync.Mutex
	flows  map[*flow]struct{}
	closed bool
}

func newConntrack() *conntrack { return &conntrack{flows: map[*flow]struct{}{}} }

// begin returns the epoch to give a flow about to be judged.
func (t *conntrack) begin() uint64 { return t.epoch.Load() }

// add registers f; false if the table is closed (the network is going away).
func (t *conntrack) add(f *flow) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.flows[f] = struct{}{}
	return true
}

func (t *conntrack) remove(f *flow) {
	t.mu.Lock()
	delete(t.flows, f)
	t.mu.Unlock()
}

// snapshot starts a new epoch and returns the flows open now.
func (t *conntrack) snapshot() []*flow {
	t.epoch.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*flow, 0, len(t.flows))
	for f := range t.flows {
		out = append(out, f)
	}
	return out
}

// closeAll closes every flow and refuses new ones.
func (t *conntrack) closeAll() {
	t.mu.Lock()
	t.closed = true
	flows := t.flows
	t.flows = map[*flow]struct{}{}
	t.mu.Unlock()
	for f := range flows {
		f.close()
	}
}

func (t *conntrack) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.flows)
}

// register puts f in the table; false (and f closed) if the network is closing. A flow judged
// before a sweep that it missed is judged again now.
func (n *network) register(f *flow) bool {
	if !n.conns.add(f) {
		f.close()
		return false
	}
	if n.conns.epoch.Load() != f.epoch {
		n.rejudgeFlow(f, RulePolicyRevoked)
	}
	return true
}

func (n *network) unregister(f *flow) { n.conns.remove(f) }

// rejudge judges every open flow again against the current policy and closes, with one audit
// event each, those it refuses. rule says why the policy changed.
func (n *network) rejudge(rule string) int {
	cut := 0
	for _, f := range n.conns.snapshot() {
		if n.rejudgeFlow(f, rule) {
			cut++
		}
	}
	return cut
}

// rejudgeFlow closes f if the current policy refuses it; true if it did.
func (n *network) rejudgeFlow(f *flow, rule string) bool {
	v, ok := n.judgeFlow(f)
	if ok || !f.revoked.CompareAndSwap(false, true) {
		return !ok
	}
	f.close()
	n.conns.remove(f)
	ev := v.ev
	ev.Layer, ev.Proto, ev.Decision, ev.Rule = f.layer, f.proto, audit.Deny, rule
	if f.sni != "" {
		ev.Host = f.sni
	}
	ev.Bytes = f.bytes.Load()
	ev.Reason = "open connection closed: " + ev.Reason
	n.emit(ev)
	return true
}

// judgeFlow judges f as if it started now, with the judge of its first packet; ok is false when
// the verdict refuses it, or allows it only in a form it does not have (a direct connection the
// policy would now send through the mitm).
func (n *network) judgeFlow(f *flow) (verdict, bool) {
	if f.proto == "udp" {
		v := n.judgeUDP(f.dst, f.port, f.names)
		return v, v.allowed()
	}
	v := n.judgeTCP(f.dst, f.port, f.names)
	switch {
	case !v.allowed():
		return v, false
	case v.shim && !f.shim:
		v.ev.Reason = "connections to this port now go through the mitm"
		return v, false
	case f.shim && v.shim:
		_, allow := n.policy()
		if _, ok := allow.Match(f.sni, f.port); !ok {
			v.ev.Reason = nameKind(f.port) + " " + f.sni + " is no longer allowed"
			return v, false
		}
	}
	return v, true
}

// armExpiry schedules the sweep at the end of an allow-all window; a later policy replaces it.
func (n *network) armExpiry(p Policy) {
	n.expiryMu.Lock()
	defer n.expiryMu.Unlock()
	if n.expiry != nil {
		n.expiry.Stop()
		n.expiry = nil
	}
	if p.Mode != netstackapi.ModeAllowAll {
		return
	}
	until := p.AllowAllUntil
	var t *time.Timer
	t = time.AfterFunc(max(time.Until(until), 0), func() {
		n.expiryMu.Lock()
		if n.expiry != t { // replaced by a later policy, whose update swept already
			n.expiryMu.Unlock()
			return
		}
		// Timers run on the monotonic clock and the window is wall time: wait on if early.
		if d := time.Until(until); d > 0 {
			t.Reset(d)
			n.expiryMu.Unlock()
			return
		}
		n.expiry = nil
		n.expiryMu.Unlock()
		if cut := n.rejudge(RuleAllowAllExpired); cut > 0 {
			n.log.Info().Int("closed", cut).Msg("allow-all expired: open connections closed")
		}
	})
	n.expiry = t
}

func (n *network) stopExpiry() {
	n.expiryMu.Lock()
	defer n.expiryMu.Unlock()
	if n.expiry != nil {
		n.expiry.Stop()
		n.expiry = nil
	}
}

// countingWriter counts the bytes a flow sent upstream.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n.Add(int64(k))
	return k, err
}
