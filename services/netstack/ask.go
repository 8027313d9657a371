package netstack

import (
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
)

// Ask mode (Policy.Ask, `nexus create --egress-ask`): a DNS query for a name the policy does not
// allow, or a TCP connection to a destination it does not allow, is held while a person may
// approve it, instead of refused at once.
const (
	// AskHold is how long a query is held: under a guest resolver's usual 5 s timeout, so that
	// its answer (SERVFAIL when nobody approved) arrives and the resolver's retry after an
	// approval succeeds.
	AskHold = 4500 * time.Millisecond
	// AskHoldTCP is how long a connection is held by default (ManagerConfig.AskHoldTCP): its
	// SYN stays unanswered (the guest retransmits it; Linux gives up after about 127 s), then
	// it is reset.
	AskHoldTCP = 30 * time.Second
	// MaxHeld bounds the queries one sandbox has held at once; past it, they are refused at once.
	MaxHeld = 16
	// MaxHeldConns bounds the connections one sandbox has held at once; past it they are reset
	// at once, audited with RuleAskLimit. Each held connection is one unanswered SYN: a guest
	// cannot make the host keep more than this many.
	MaxHeldConns = 16
	// RuleAskTimeout is the audit rule of a held query or connection nobody approved in time.
	RuleAskTimeout = "ask_timeout"
	// RuleAskRejected is the audit rule of a held query or connection whose request was rejected.
	RuleAskRejected = "ask_rejected"
	// RuleAskLimit is the audit rule of a connection refused because MaxHeldConns are held.
	RuleAskLimit = "ask_held_limit"
	askPoll      = 250 * time.Millisecond
	// maxPolicyPending bounds Policy.Pending (the gateway keeps at most 32 requests a sandbox).
	maxPolicyPending = 256
)

// askHeld counts a network's held queries and connections.
type askHeld struct{ dns, tcp atomic.Int32 }

// askOutcome is how a hold ended.
type askOutcome int

const (
	askApproved askOutcome = iota
	askTimedOut
	askRejected
	askFull
)

// rule is the audit rule of a hold that did not end approved.
func (o askOutcome) rule() string {
	switch o {
	case askRejected:
		return RuleAskRejected
	case askFull:
		return RuleAskLimit
	}
	return RuleAskTimeout
}

// reason says how a hold that did not end approved ended.
func (o askOutcome) reason() string {
	switch o {
	case askRejected:
		return "held for approval, the request was rejected"
	case askFull:
		return "not held for approval: too many are held already"
	}
	return "held for approval, none came in time"
}

// guestSocket is the guest's end of a held query or connection.
type guestSocket struct {
	proto string
	port  int
}

// askWait is one hold, known to setPolicy so that each policy change wakes it and none of
// its Pending states is missed (guarded by network.polMu).
type askWait struct {
	key            string
	seen, rejected bool
	wake           chan struct{}
}

// noteHolds tells the holds of p (held with polMu): a request seen pending and then no longer
// was rejected.
func (n *network) noteHolds(p Policy) {
	for w := range n.holds {
		if slices.Contains(p.Pending, w.key) {
			w.seen = true
		} else if w.seen {
			w.rejected = true
		}
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// holdForApproval reports a pending request for host:port (ManagerConfig.OnRequest; port 0 is
// a DNS query) and waits up to hold for a policy under which allowed is true. It ends early when
// the network closes, or when the request was seen pending (Policy.Pending) and is no longer
// (rejected). count, bounded by limit, is the network's number of such holds.
func (n *network) holdForApproval(count *atomic.Int32, limit int32, host string, port int, src guestSocket, hold time.Duration, allowed func() bool) askOutcome {
	if count.Add(1) > limit {
		count.Add(-1)
		return askFull
	}
	defer count.Add(-1)
	w := &askWait{key: netstackapi.PendingKey(host, port), wake: make(chan struct{}, 1)}
	n.polMu.Lock()
	w.seen = slices.Contains(n.pol.Pending, w.key)
	n.holds[w] = struct{}{}
	n.polMu.Unlock()
	defer func() {
		n.polMu.Lock()
		delete(n.holds, w)
		n.polMu.Unlock()
	}()
	if f := n.svc.cfg.OnRequest; f != nil {
		f(netstackapi.EgressRequest{SandboxID: n.id, SandboxName: n.name, Host: host, Port: port, Proto: src.proto, SrcPort: src.port, Time: time.Now().UTC()})
	}
	deadline := time.NewTimer(hold)
	defer deadline.Stop()
	tick := time.NewTicker(askPoll) // DNS answers change what an address is, without a policy change
	defer tick.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return askTimedOut
		case <-deadline.C:
			return askTimedOut
		case <-tick.C:
		case <-w.wake:
		}
		if allowed() {
			return askApproved
		}
		n.polMu.RLock()
		rejected := w.rejected
		n.polMu.RUnlock()
		if rejected {
			return askRejected
		}
	}
}

// holdTCP holds a connection to dst:port that v refused, in ask mode, until a person approves
// (the verdict judged again is returned, allowed) or it ends otherwise (v refused with the
// ask rule). The SYN stays unanswered meanwhile.
func (n *network) holdTCP(v verdict, dst netip.Addr, port int, names []string, src guestSocket) verdict {
	host := dst.String()
	if len(names) > 0 {
		host = names[0]
	}
	var again verdict
	out := n.holdForApproval(&n.held.tcp, MaxHeldConns, host, port, src, n.svc.cfg.AskHoldTCP, func() bool {
		again = n.judgeTCP(dst, port, n.namesFor(dst, time.Now()))
		return again.allowed()
	})
	if out == askApproved {
		return again
	}
	v.ev.Host, v.ev.Rule, v.ev.Reason = host, out.rule(), v.ev.Reason+"; "+out.reason()
	v.ev.Decision = audit.Deny
	return v
}
