package gateway

import (
	"context"
	"errors"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// HostCheckEvery is how often the gateway compares the hosts' heartbeats with the registry
// (checkHosts). A host is lost bus.HostTTL after its last heartbeat, so its sandboxes are
// failed at most HostLossBound after it went silent.
var HostCheckEvery = bus.HeartbeatEvery

// HostLossBound is the longest a sandbox of a host that went silent stays running in the
// registry: the heartbeat's TTL plus one check (DESIGN §10, deploy/README.md).
const HostLossBound = bus.HostTTL + bus.HeartbeatEvery

// hostLost is the reason a sandbox of a lost host is failed with; its prefix finds them
// again when the host is back.
func hostLost(host string) string { return "host " + host + " lost" }

// watchHosts runs checkHosts every HostCheckEvery until ctx ends.
func (g *Service) watchHosts(ctx context.Context) {
	every(ctx, HostCheckEvery, func(ctx context.Context) { g.checkHosts(ctx, g.hostStates(ctx)) })
}

// checkHosts fails the running and paused sandboxes of every lost host with "host X lost",
// and settles those of a host that is back: a VM that still runs there is adopted again (its
// record back to running or paused; its perimeter on that host was never torn down), one that
// does not is cleaned up (VM stopped, perimeter released) and stays failed, saying so. The
// gateway's own host is never judged lost by its heartbeat: a restarting vmm beside it is
// settled by reconcile. Without heartbeats (a single host, or a bus from before them) nothing
// is done.
func (g *Service) checkHosts(ctx context.Context, hosts []bus.HostState) {
	if len(hosts) == 0 {
		return
	}
	state := make(map[string]string, len(hosts))
	for _, h := range hosts {
		state[h.Host] = h.State
	}
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		return
	}
	for _, sb := range all {
		if sb.Host == g.cfg.Host {
			continue
		}
		st, known := state[sb.Host]
		if !known {
			continue
		}
		switch {
		case st == bus.HostLost && (sb.State == api.StateRunning || sb.State == api.StatePaused):
			g.failLost(ctx, sb)
		case st != bus.HostLost && sb.State == api.StateFailed && sb.Reason == hostLost(sb.Host):
			if err := g.hostBack(ctx, sb); err != nil && ctx.Err() == nil {
				g.log.Warn().Err(err).Str("sandbox", sb.Name).Str("host", sb.Host).Msg("host back: cannot settle the sandbox yet")
			}
		}
	}
}

// failLost records that sb's host is lost. Its perimeter lives on that host and is left as it
// is: the host may only be cut off, and its VM may still run when it is back (hostBack).
func (g *Service) failLost(ctx context.Context, sb *api.Sandbox) {
	reason := hostLost(sb.Host)
	err := g.reg.Transition(ctx, sb, api.StateFailed, reason, nil)
	if err != nil {
		if !errors.Is(err, errdefs.ErrConflict) {
			g.log.Warn().Err(err).Str("sandbox", sb.Name).Msg("host lost: cannot record the sandbox failed")
		}
		return // changed meanwhile: judged again at the next check
	}
	g.log.Warn().Str("sandbox", sb.Name).Str("host", sb.Host).Str("reason", reason).Msg("sandbox failed")
}

// hostBack settles a sandbox failed because its host was lost, now that the host heartbeats
// again: adopted when its vmm still runs its VM, else cleaned up and left failed.
func (g *Service) hostBack(ctx context.Context, sb *api.Sandbox) error {
	vi, err := g.vmm(sb.Host).Inspect(ctx, sb.ID)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err // not answering yet: the next check tries again
	}
	if err == nil && vi.Running {
		started := sb.StartedAt
		back := "host " + sb.Host + " is back and the VM still runs"
		if err := g.reg.Transition(ctx, sb, api.StateStarting, back, nil); err != nil {
			return err
		}
		keep := func(n *api.Sandbox) { n.StartedAt = started }
		if err := g.reg.Transition(ctx, sb, api.StateRunning, "", keep); err != nil {
			return err
		}
		if vi.Paused {
			if err := g.reg.Transition(ctx, sb, api.StatePaused, "", nil); err != nil {
				return err
			}
		}
		g.log.Info().Str("sandbox", sb.Name).Str("host", sb.Host).Msg("host back: sandbox adopted again")
		return nil
	}
	if err := g.vmm(sb.Host).Stop(ctx, sb.ID, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if err := g.teardownPerimeter(ctx, sb); err != nil {
		return err
	}
	reason := hostLost(sb.Host) + "; its VM did not survive: start it again with `nexus start " + sb.Name + "`"
	if err := g.reg.Transition(ctx, sb, api.StateFailed, reason, nil); err != nil {
		return err
	}
	g.log.Info().Str("sandbox", sb.Name).Str("host", sb.Host).Msg("host back: the sandbox's VM did not survive; cleaned up")
	return nil
}
