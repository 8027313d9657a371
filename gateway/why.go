package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
)

const (
	// whyWindow is how far back nexus-why looks for a sandbox's refusals.
	whyWindow = time.Hour
	// whyReadTimeout bounds the read of the audit stream for one nexus-why call.
	whyReadTimeout = 3 * time.Second
)

// egressWhy answers a guest's nexus-why, forwarded by the vmm from the sandbox's agent channel
// (the vmm names the sandbox; only it may call this): its recent refusals of every layer, read
// from the audit stream, with what would allow each, or a request for a host, both judged by
// the sandbox's netstack under its live policy.
func (g *Service) egressWhy(ctx context.Context, r api.EgressWhyRequest) (netapi.WhyReply, error) {
	sb, err := g.sandboxByID(ctx, r.SandboxID)
	if err != nil {
		return netapi.WhyReply{}, err
	}
	if sb.Egress.Mode == api.EgressNone {
		if r.Request != nil {
			return netapi.WhyReply{Status: http.StatusConflict, Message: "this sandbox has egress none: nothing leaves it, and a request cannot change that"}, nil
		}
		rep := agentproto.WhyReport{Sandbox: sb.Name, Mode: api.EgressNone, Denials: []agentproto.WhyDenial{}}
		return netapi.WhyReply{Status: http.StatusOK, Report: &rep}, nil
	}
	wr := netapi.WhyRequest{SandboxID: sb.ID, Request: r.Request}
	if r.Request == nil {
		wr.Denials = g.recentDenials(ctx, sb.ID)
	}
	return netapi.Why.Call(ctx, g.cfg.Bus, sb.Host, wr)
}

// recentDenials reads the last netapi.MaxWhyDenials refusals of the sandbox id within
// whyWindow from the audit stream (every service's), oldest first; best effort within
// whyReadTimeout. Policy changes and the audit path's own summaries are not refusals of the
// guest's traffic.
func (g *Service) recentDenials(ctx context.Context, id string) []audit.Event {
	ctx, cancel := context.WithTimeout(ctx, whyReadTimeout)
	defer cancel()
	ring := make([]audit.Event, 0, netapi.MaxWhyDenials)
	err := audit.Tail(ctx, g.cfg.Bus, audit.TailOptions{Sandboxes: []string{id}, Since: time.Now().Add(-whyWindow), Denied: true}, func(ev audit.Event) error {
		if ev.Layer == audit.LayerPolicy || ev.Layer == audit.LayerAudit {
			return nil
		}
		if len(ring) == netapi.MaxWhyDenials {
			ring = append(ring[:0], ring[1:]...)
		}
		ring = append(ring, ev)
		return nil
	})
	if err != nil {
		g.log.Warn().Err(err).Str("sandbox", id).Msg("nexus-why: the audit stream was not read")
	}
	return ring
}

// sandboxByID returns the record of the sandbox id (a vmm that re-adopted a VM after a restart
// knows it by id alone).
func (g *Service) sandboxByID(ctx context.Context, id string) (*api.Sandbox, error) {
	all, err := g.reg.View(ctx, nil)
	if err != nil {
		return nil, err
	}
	for _, sb := range all {
		if sb.ID == id {
			return sb, nil
		}
	}
	return nil, errdefs.NotFound("no sandbox %s", clipArg(id))
}
