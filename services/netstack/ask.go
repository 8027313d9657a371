package netstack

import (
	"sync/atomic"
	"time"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
)

// Ask mode (Policy.Ask, `nexus create --egress-ask`): a DNS query for a name the policy does not
// allow is held while a person may approve it, instead of answered NXDOMAIN at once.
const (
	// AskHold is how long a query is held: under a guest resolver's usual 5 s timeout, so that
	// its answer (SERVFAIL when nobody approved) arrives and the resolver's retry after an
	// approval succeeds.
	AskHold = 4500 * time.Millisecond
	// MaxHeld bounds the queries one sandbox has held at once; past it, they are refused at once.
	MaxHeld = 16
	// RuleAskTimeout is the audit rule of a held query nobody approved in time.
	RuleAskTimeout = "ask_timeout"
	askPoll        = 100 * time.Millisecond
)

// askHeld counts a network's held queries.
type askHeld struct{ n atomic.Int32 }

// holdForApproval reports a pending request for name (ManagerConfig.OnRequest) and waits up to
// AskHold for a policy that allows it; false when none came, the network closed or too many
// queries are held already.
func (n *network) holdForApproval(name string, port int) bool {
	if n.held.n.Add(1) > MaxHeld {
		n.held.n.Add(-1)
		return false
	}
	defer n.held.n.Add(-1)
	if f := n.svc.cfg.OnRequest; f != nil {
		f(netstackapi.EgressRequest{SandboxID: n.id, SandboxName: n.name, Host: name, Port: port, Time: time.Now().UTC()})
	}
	deadline := time.NewTimer(AskHold)
	defer deadline.Stop()
	tick := time.NewTicker(askPoll)
	defer tick.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return false
		case <-deadline.C:
			return false
		case <-tick.C:
			if _, allow := n.policy(); allow != nil {
				if _, ok := allow.MatchName(name); ok {
					return true
				}
			}
		}
	}
}
