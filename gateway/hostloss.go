package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

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

// hostLostStopping is the reason of a sandbox whose host was lost while it was stopping: its
// stop is finished when the host is back.
func hostLostStopping(host string) string { return hostLost(host) + " while the sandbox was stopping" }

// failedForHostLoss reports whether sb is failed because its host was lost, whatever became
// of it since: later failures of calls to that host do not replace the reason.
func failedForHostLoss(sb *api.Sandbox) bool {
	return sb.State == api.StateFailed && strings.HasPrefix(sb.Reason, hostLost(sb.Host))
}

// errHostLost is how a boot under way on a host that is lost ends (see checkHosts).
type errHostLost struct{ host, name string }

func (e errHostLost) Error() string {
	return fmt.Sprintf("host %s lost while sandbox %s was starting: it is failed, and adopted again or cleaned up when the host is back", e.host, e.name)
}

func (e errHostLost) Is(target error) bool { return target == errdefs.ErrUnavailable }

// isHostLost reports whether the host of a sandbox is lost now (its heartbeat expired). A
// host without heartbeats (a single host, or a bus from before them) is never lost.
func (g *Service) isHostLost(ctx context.Context, host string) bool {
	if host == g.cfg.Host {
		return false
	}
	for _, h := range g.hostStates(ctx) {
		if h.Host == host {
			return h.State == bus.HostLost
		}
	}
	return false
}

// onLostHost turns the failure of a call to host's services into "host X lost" when host's
// heartbeat has expired: "the vmm service is not running" names nothing a user knows is gone.
func (g *Service) onLostHost(ctx context.Context, host, what string, err error) error {
	if err == nil || !errors.Is(err, errdefs.ErrUnavailable) {
		return err
	}
	// The call may have used up the caller's deadline: the heartbeats get a moment of their own.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if !g.isHostLost(hctx, host) {
		return err
	}
	return errdefs.Unavailable("%s: %s (no heartbeat): it answers again when the host is back (`nexus hosts` shows it)", what, hostLost(host))
}

// watchHosts runs checkHosts every HostCheckEvery until ctx ends.
func (g *Service) watchHosts(ctx context.Context) {
	every(ctx, HostCheckEvery, func(ctx context.Context) { g.checkHosts(ctx, g.hostStates(ctx)) })
}

// checkHosts fails the sandboxes of every lost host with "host X lost" and settles those of
// a host that is back:
//   - running, paused or starting: failed "host X lost" (a boot this gateway has under way
//     there ends at once, saying so). Back, a VM that still runs there is adopted again (its
//     record back to running or paused; its perimeter on that host was never torn down), one
//     that does not is cleaned up (VM stopped, perimeter released) and stays failed, saying so;
//   - stopping: failed "host X lost while the sandbox was stopping"; back, the stop is
//     finished and the sandbox is stopped;
//   - removing: removed as `nexus rm` removes a sandbox of a lost host (removeOnLostHost):
//     the record goes now, and the host removes what it holds of it when it is back.
//
// The gateway's own host is never judged lost by its heartbeat: a restarting vmm beside it is
// settled by reconcile. Without heartbeats (a single host, or a bus from before them) nothing
// is done.
func (g *Service) checkHosts(ctx context.Context, hosts []bus.HostState) {
	if len(hosts) == 0 {
		return
	}
	state := make(map[string]string, len(hosts))
	for _, h := range hosts {
		state[h.Host] = h.State
		if h.State != bus.HostLost && h.PendingRemovals > 0 && h.Host != g.cfg.Host {
			if err := g.settleRemovals(ctx, h.Host); err != nil && ctx.Err() == nil {
				g.log.Warn().Err(err).Str("host", h.Host).Msg("host back: cannot remove the leftovers of removed sandboxes yet")
			}
		}
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
		var err error
		switch {
		case st == bus.HostLost && (sb.State == api.StateRunning || sb.State == api.StatePaused || sb.State == api.StateStarting):
			g.failLost(ctx, sb, hostLost(sb.Host))
		case st == bus.HostLost && sb.State == api.StateStopping:
			g.failLost(ctx, sb, hostLostStopping(sb.Host))
		case st == bus.HostLost && sb.State == api.StateRemoving:
			err = g.removeOnLostHost(ctx, sb)
		case st != bus.HostLost && sb.State == api.StateFailed && sb.Reason == hostLost(sb.Host):
			err = g.hostBack(ctx, sb)
		case st != bus.HostLost && sb.State == api.StateFailed && sb.Reason == hostLostStopping(sb.Host):
			err = g.finishStop(ctx, sb)
		}
		if err != nil && ctx.Err() == nil {
			g.log.Warn().Err(err).Str("sandbox", sb.Name).Str("host", sb.Host).Str("host_state", st).Msg("host check: cannot settle the sandbox yet")
		}
	}
}

// failLost records that sb's host is lost, with reason. Its perimeter lives on that host and
// is left as it is: the host may only be cut off, and its VM may still run when it is back
// (hostBack). A boot of sb this gateway has under way ends now with errHostLost.
func (g *Service) failLost(ctx context.Context, sb *api.Sandbox, reason string) {
	starting := sb.State == api.StateStarting
	err := g.reg.Transition(ctx, sb, api.StateFailed, reason, nil)
	if err != nil {
		if !errors.Is(err, errdefs.ErrConflict) {
			g.log.Warn().Err(err).Str("sandbox", sb.Name).Msg("host lost: cannot record the sandbox failed")
		}
		return // changed meanwhile: judged again at the next check
	}
	if b, ok := g.booting.Load(sb.ID); ok && starting {
		b.(*bootCall).cancel(errHostLost{host: sb.Host, name: sb.Name})
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

// removeOnLostHost removes sb, whose host is lost: the removal owed to the host is recorded
// first (so that nothing is forgotten), its credentials go (the credbroker is not on that
// host), then its record. What the host still holds of it, its VM, disk and perimeter, is
// removed when the host is back (settleRemovals). A record already gone is removed.
func (g *Service) removeOnLostHost(ctx context.Context, sb *api.Sandbox) error {
	if sb.State != api.StateRemoving {
		if err := g.reg.Transition(ctx, sb, api.StateRemoving, hostLost(sb.Host), nil); err != nil {
			return err
		}
	}
	kv, err := bus.KV(ctx, g.cfg.Bus, bus.KVHosts)
	if err != nil {
		return fmt.Errorf("remove %s: %w", sb.Name, err)
	}
	kctx, cancel := bus.StoreContext(ctx)
	err = bus.OweRemoval(kctx, kv, bus.Removal{Host: sb.Host, ID: sb.ID, Name: sb.Name, At: time.Now().UTC()})
	cancel()
	if err != nil {
		return fmt.Errorf("remove %s: recording what host %s still holds of it: %w", sb.Name, sb.Host, err)
	}
	if err := g.cred().Forget(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("remove %s: %w", sb.Name, err)
	}
	if err := g.reg.Delete(ctx, sb); err != nil {
		if cur, gerr := g.reg.Get(ctx, sb.Name); errors.Is(gerr, errdefs.ErrNotFound) || (gerr == nil && cur.ID != sb.ID) {
			return nil // removed meanwhile (another gateway's check, or the rm this one raced)
		}
		return err
	}
	g.log.Warn().Str("sandbox", sb.Name).Str("host", sb.Host).Msg("removed while its host is lost: the host removes its VM and disk when it is back")
	return nil
}

// settleRemovals removes, on host now back, what it still holds of the sandboxes removed while
// it was lost: each VM and disk, and its perimeter there; each removal is forgotten once done.
func (g *Service) settleRemovals(ctx context.Context, host string) error {
	kv, err := bus.KV(ctx, g.cfg.Bus, bus.KVHosts)
	if err != nil {
		return err
	}
	lctx, cancel := bus.StoreContext(ctx)
	owed, err := bus.Removals(lctx, kv, host)
	cancel()
	if err != nil {
		return err
	}
	for _, r := range owed {
		if err := g.vmm(host).Remove(ctx, r.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("remove the VM of %s (%s): %w", r.Name, r.ID, err)
		}
		if err := g.teardownPerimeter(ctx, &api.Sandbox{ID: r.ID, Name: r.Name, Host: host}); err != nil {
			return fmt.Errorf("release the perimeter of %s (%s): %w", r.Name, r.ID, err)
		}
		kctx, cancel := bus.StoreContext(ctx)
		err := bus.SettleRemoval(kctx, kv, r)
		cancel()
		if err != nil {
			return err
		}
		g.log.Info().Str("sandbox", r.Name).Str("id", r.ID).Str("host", host).Msg("host back: removed what it held of a sandbox removed while it was lost")
	}
	return nil
}

// finishStop finishes the stop of sb that the loss of its host cut off, now that it is back.
func (g *Service) finishStop(ctx context.Context, sb *api.Sandbox) error {
	if err := g.vmm(sb.Host).Stop(ctx, sb.ID, false); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if err := g.teardownPerimeter(ctx, sb); err != nil {
		return err
	}
	if err := g.reg.Transition(ctx, sb, api.StateStopped, "", nil); err != nil {
		return err
	}
	g.log.Info().Str("sandbox", sb.Name).Str("host", sb.Host).Msg("host back: the stop its loss cut off is finished")
	return nil
}
