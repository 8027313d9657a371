package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/pkg/agentproto"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/policy"
)

// Ask mode (issue 26): an ask-mode sandbox's netstack holds a query for a host off the list and
// reports it; the gateway keeps it as a pending request in the sandbox's record (it survives a
// restart) until a person approves (a grant) or rejects it.

// Audit rules of ask mode.
const (
	RuleEgressRequest = "egress_request"
	RuleEgressReject  = "egress_reject"
	RuleEgressApprove = "egress_approve"
	maxRequestMsg     = 4 << 10
	// maxCmdline bounds the command line shown for a request.
	maxCmdline = 200
)

// watchRequests records the requests the netstacks report, one at a time.
func (g *Service) watchRequests(ctx context.Context) error {
	in := make(chan netapi.EgressRequest, 64)
	sub, err := g.cfg.Bus.Subscribe(netapi.RequestSubjectPrefix+".>", func(m *nats.Msg) {
		var r netapi.EgressRequest
		if len(m.Data) > maxRequestMsg || json.Unmarshal(m.Data, &r) != nil {
			return
		}
		if !strings.HasSuffix(m.Subject, "."+r.SandboxID) {
			return // a netstack reports only under the sandbox's own subject
		}
		select {
		case in <- r:
		default: // a flood: the guest's resolver retries anyway
		}
	})
	if err != nil {
		return err
	}
	go func() {
		defer sub.Unsubscribe()
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-in:
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if err := g.recordRequest(rctx, r); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
					g.log.Warn().Err(err).Str("sandbox", r.SandboxName).Msg("egress request not recorded")
				}
				cancel()
			}
		}
	}()
	return nil
}

// recordRequest adds a reported request to its sandbox, or counts it again.
func (g *Service) recordRequest(ctx context.Context, r netapi.EgressRequest) error {
	host, err := policy.NormalizeHost(r.Host)
	if err != nil || r.Port < 0 || r.Port > 65535 {
		return nil
	}
	name, err := api.ParseName(r.SandboxName)
	if err != nil {
		return nil
	}
	for attempt := 0; ; attempt++ {
		sb, err := g.reg.Get(ctx, name)
		if err != nil {
			return err
		}
		if sb.ID != r.SandboxID || !sb.Egress.Ask {
			return nil
		}
		now := time.Now().UTC()
		next := *sb
		next.Egress.Requests = slices.Clone(sb.Egress.Requests)
		var fresh *api.EgressRequest
		reason := agentproto.CleanGuestText(r.Reason, agentproto.MaxWhyReason)
		if i := slices.IndexFunc(next.Egress.Requests, func(x api.EgressRequest) bool { return x.Host == host && x.Port == r.Port }); i >= 0 {
			next.Egress.Requests[i].Count++
			next.Egress.Requests[i].Last = now
			if reason != "" {
				next.Egress.Requests[i].Reason = reason
			}
		} else if len(next.Egress.Requests) >= api.MaxPendingRequests {
			return nil // full: the oldest must be answered first
		} else {
			next.Egress.Requests = append(next.Egress.Requests, api.EgressRequest{ID: "r-" + randomHex(4), Sandbox: sb.Name, Host: host, Port: r.Port, First: now, Last: now, Count: 1, Reason: reason})
			fresh = &next.Egress.Requests[len(next.Egress.Requests)-1]
		}
		err = g.reg.Update(ctx, &next)
		if errors.Is(err, errdefs.ErrConflict) && attempt < 5 {
			continue
		}
		if err == nil && fresh != nil {
			// The netstack learns it is pending: a held query or connection whose request is
			// then rejected is refused at once.
			if _, perr := g.pushEgress(ctx, &next); perr != nil {
				g.log.Warn().Err(perr).Str("sandbox", sb.Name).Msg("pending egress request not pushed")
			}
			if (r.Proto == "tcp" || r.Proto == "udp") && r.SrcPort > 0 && r.SrcPort <= 65535 {
				go g.nameAsker(context.WithoutCancel(ctx), sb.Name, fresh.ID, r.Proto, r.SrcPort)
			}
			why := "pending request " + fresh.ID + ": nexus egress approve " + fresh.ID + " or reject " + fresh.ID
			if reason != "" {
				why += fmt.Sprintf("; reason reported by the guest: %q", reason)
			}
			g.emitAudit(audit.Event{Sandbox: sb.ID, Name: sb.Name, Layer: audit.LayerPolicy, Host: host, Port: r.Port, Decision: audit.Deny,
				Rule: RuleEgressRequest, By: "the guest", Reason: why})
		}
		return err
	}
}

// nameAsker asks the guest agent which process holds the socket a request came from and
// records its command line in the request; best effort: at most cap(askers) at once, a few
// seconds each, nothing when the process is gone or the agent cannot tell.
func (g *Service) nameAsker(ctx context.Context, name, id, proto string, port int) {
	select {
	case g.askers <- struct{}{}:
		defer func() { <-g.askers }()
	default:
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	argv := []string{agentproto.GuestBinDir + "/nexus-agent", "owner", proto, strconv.Itoa(port)}
	res, err := g.runIn(ctx, api.ExecRequest{Name: name, Argv: argv}, nil, 5*time.Second)
	if err != nil || res.exit.Code != 0 {
		return
	}
	cmdline := agentproto.CleanGuestText(res.stdout.String(), maxCmdline)
	if cmdline == "" {
		return
	}
	n, err := api.ParseName(name)
	if err != nil {
		return
	}
	for attempt := 0; attempt < 5; attempt++ {
		sb, err := g.reg.Get(ctx, n)
		if err != nil {
			return
		}
		i := slices.IndexFunc(sb.Egress.Requests, func(x api.EgressRequest) bool { return x.ID == id })
		if i < 0 {
			return // answered meanwhile
		}
		next := *sb
		next.Egress.Requests = slices.Clone(sb.Egress.Requests)
		next.Egress.Requests[i].Cmdline = cmdline
		if err := g.reg.Update(ctx, &next); !errors.Is(err, errdefs.ErrConflict) {
			return
		}
	}
}

func (g *Service) egressRequests(ctx context.Context, _ api.Empty) ([]api.EgressRequest, error) {
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := []api.EgressRequest{}
	for _, sb := range all {
		for _, r := range sb.Egress.Requests {
			out = append(out, r.Labelled())
		}
	}
	return out, nil
}

// findRequest returns the sandbox holding the pending request id.
func (g *Service) findRequest(ctx context.Context, id string) (*api.Sandbox, api.EgressRequest, error) {
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		return nil, api.EgressRequest{}, err
	}
	for _, sb := range all {
		for _, r := range sb.Egress.Requests {
			if r.ID == id {
				return sb, r, nil
			}
		}
	}
	return nil, api.EgressRequest{}, errdefs.NotFound("no pending egress request %s (see nexus egress requests)", clipArg(id))
}

func dropRequest(id string) func(*api.Sandbox) error {
	return func(sb *api.Sandbox) error {
		sb.Egress.Requests = slices.DeleteFunc(slices.Clone(sb.Egress.Requests), func(x api.EgressRequest) bool { return x.ID == id })
		return nil
	}
}

// egressApprove grants a pending request's host (its port, or --port, or 443 and 80) and drops it.
func (g *Service) egressApprove(ctx context.Context, r api.EgressAnswerRequest) (api.EgressChange, error) {
	sb, req, err := g.findRequest(ctx, r.ID)
	if err != nil {
		return api.EgressChange{}, err
	}
	rule := policy.Rule{Host: req.Host, Ports: r.Ports}
	if len(rule.Ports) == 0 && req.Port != 0 {
		rule.Ports = []int{req.Port}
	}
	if rule, err = rule.Normalize(); err != nil {
		return api.EgressChange{}, err
	}
	ch, err := g.egressAllow(ctx, api.EgressChangeRequest{Name: sb.Name, Host: rule.String(), For: r.For, By: r.By, Via: r.Via})
	if err != nil {
		return api.EgressChange{}, err
	}
	if _, err := g.changeEgress(ctx, sb.Name, RuleEgressApprove, req.Host, cleanBy(r.By, r.Via), "approved "+req.ID+" as "+rule.String(), nil, dropRequest(req.ID)); err != nil {
		return ch, err
	}
	return ch, nil
}

// egressReject drops a pending request; the guest's held query fails as it would have.
func (g *Service) egressReject(ctx context.Context, r api.EgressAnswerRequest) (api.EgressChange, error) {
	if err := g.mcpEgressOff(api.EgressChangeRequest{Via: r.Via}); err != nil {
		return api.EgressChange{}, err
	}
	sb, req, err := g.findRequest(ctx, r.ID)
	if err != nil {
		return api.EgressChange{}, err
	}
	return g.changeEgress(ctx, sb.Name, RuleEgressReject, req.Host, cleanBy(r.By, r.Via), "rejected "+req.ID, nil, dropRequest(req.ID))
}
