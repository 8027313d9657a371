package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// watchVMs marks a sandbox failed when its vmm reports that the VM ended on its own.
func (g *Service) watchVMs(ctx context.Context) (*nats.Subscription, error) {
	return g.cfg.Bus.Subscribe(vmmapi.VMEventSubject("*"), func(m *nats.Msg) {
		var ev vmmapi.VMEvent
		if json.Unmarshal(m.Data, &ev) != nil || ev.ID == "" {
			return
		}
		if b, ok := g.booting.Load(ev.ID); ok && ev.Failed != "" {
			b.(*bootCall).cancel(errors.New(ev.Failed))
		}
		go g.markFailed(ctx, ev.ID, ev.Failed)
	})
}

// markFailed records that a sandbox's VM ended on its own and releases its perimeter, so that
// `nexus start` sets it up again from nothing.
func (g *Service) markFailed(ctx context.Context, id, reason string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for range 3 {
		sb, err := g.byID(ctx, id)
		if err != nil {
			return
		}
		switch sb.State {
		case api.StateStopped, api.StateStopping, api.StateRemoving, api.StateFailed, api.StateCreated:
			return // nobody expects a VM there
		}
		err = g.reg.Transition(ctx, sb, api.StateFailed, reason, nil)
		if err == nil {
			g.log.Warn().Str("sandbox", sb.Name).Str("reason", reason).Msg("sandbox failed")
			if err := g.teardownPerimeter(ctx, sb); err != nil {
				g.log.Warn().Err(err).Str("sandbox", sb.Name).Msg("perimeter teardown incomplete")
			}
			return
		}
		if !errors.Is(err, errdefs.ErrConflict) {
			return
		}
	}
}

func (g *Service) byID(ctx context.Context, id string) (*api.Sandbox, error) {
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	for _, sb := range all {
		if sb.ID == id {
			return sb, nil
		}
	}
	return nil, errdefs.NotFound("no sandbox with id %s", id)
}

// Overdue is how long a sandbox may stay mid-transition (starting, stopping, removing) before
// the periodic reconcile settles it: a boot under TCG takes up to the vmm's boot timeout.
var Overdue = 5 * time.Minute

// recoverOnStart settles, before this gateway serves anything, every operation that a crash of
// the previous one left half done (see settle). The services it needs may be starting with it:
// what they cannot answer yet is retried until wait has passed, then left to reconcile.
func (g *Service) recoverOnStart(ctx context.Context, wait time.Duration) {
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		g.log.Warn().Err(err).Msg("recovery: cannot list the registry")
		return
	}
	deadline := time.Now().Add(wait)
	for _, sb := range all {
		switch sb.State {
		case api.StateCreated, api.StateStopped, api.StateFailed:
			continue // nothing runs, nothing is under way
		}
		for {
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = g.settleFresh(sctx, sb.Name, sb.ID)
			cancel()
			if err == nil || !errors.Is(err, errdefs.ErrUnavailable) || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		if err != nil {
			g.log.Warn().Err(err).Str("sandbox", sb.Name).Msg("recovery: cannot settle the sandbox yet")
		}
	}
	go g.settleSnapshotsOnStart(ctx, time.Now(), deadline)
}

// settleFresh reads the record of name again (an earlier attempt may have moved it) and
// settles it against its vmm.
func (g *Service) settleFresh(ctx context.Context, name, id string) error {
	sb, err := g.reg.Get(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if sb.ID != id {
		return nil
	}
	vi, err := g.vmm(sb.Host).Inspect(ctx, sb.ID)
	if err != nil {
		return err
	}
	return g.settle(ctx, sb, vi, true)
}

// reconcile compares the registry with what the vmm of each host runs (settle); a sandbox
// mid-transition is judged only once it is overdue, as its operation may still be under way.
func (g *Service) reconcile(ctx context.Context) {
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		g.log.Warn().Err(err).Msg("reconcile: cannot list the registry")
		return
	}
	for _, sb := range all {
		switch sb.State {
		case api.StateRunning, api.StatePaused:
		case api.StateStarting, api.StateStopping, api.StateRemoving:
			if time.Since(sb.UpdatedAt) < Overdue {
				continue
			}
		default:
			continue
		}
		vi, err := g.vmm(sb.Host).Inspect(ctx, sb.ID)
		if err != nil {
			continue // that vmm is not up yet; it reports failures itself when it starts
		}
		if err := g.settle(ctx, sb, vi, false); err != nil {
			g.log.Warn().Err(err).Str("sandbox", sb.Name).Str("state", string(sb.State)).Msg("reconcile: cannot settle the sandbox")
		}
	}
	g.settleSnapshots(ctx, time.Now().Add(-orphanAge))
}

// settle makes sb's record true to vi, what its vmm runs, finishing or undoing the operation
// an interrupted gateway left: a removal is finished; a boot whose VM runs (the vmm serves a VM
// only once every boot step ran) is running, one whose VM does not is failed with the reason
// and nothing of it is left set up; a stop is finished; a running or paused sandbox whose VM is
// gone is failed; at start (nothing else under way), a pause or resume cut off between the VM
// and the record is completed. A perimeter is released before the record says nothing runs,
// so an error leaves the record as it was, to be settled again.
func (g *Service) settle(ctx context.Context, sb *api.Sandbox, vi vmmapi.VMInfo, atStart bool) error {
	failed := func(reason string) error {
		if err := g.teardownPerimeter(ctx, sb); err != nil {
			return err
		}
		return g.reg.Transition(ctx, sb, api.StateFailed, reason, nil)
	}
	switch {
	case sb.State == api.StateRemoving:
		return g.remove(ctx, sb, true)
	case sb.State == api.StateStarting && vi.Running:
		return g.reg.Transition(ctx, sb, api.StateRunning, "", nil)
	case sb.State == api.StateStarting:
		// Kill a boot a live vmm may still run for a gateway that is gone: its VM would have no
		// perimeter behind it.
		if err := g.vmm(sb.Host).Stop(ctx, sb.ID, true); err != nil {
			return err
		}
		reason := vi.Failed
		if reason == "" {
			reason = "nexus restarted while the sandbox was starting"
		}
		return failed(reason + "; start it again with `nexus start " + sb.Name + "`")
	case sb.State == api.StateStopping:
		if err := g.vmm(sb.Host).Stop(ctx, sb.ID, false); err != nil {
			return err
		}
		if err := g.teardownPerimeter(ctx, sb); err != nil {
			return err
		}
		return g.reg.Transition(ctx, sb, api.StateStopped, "", nil)
	case !vi.Running:
		reason := vi.Failed
		if reason == "" {
			reason = "the VM is not running (found by reconcile after a restart)"
		}
		return failed(reason)
	case !atStart:
		// A pause, resume or snapshot may be under way between the VM and the record.
	case sb.State == api.StateRunning && vi.Paused:
		// A pause (or a snapshot) was cut off before the record said so: what the user saw
		// last is a running sandbox.
		return g.vmm(sb.Host).Resume(ctx, sb.ID)
	case sb.State == api.StatePaused && !vi.Paused:
		return g.reg.Transition(ctx, sb, api.StateRunning, "", nil)
	}
	return nil
}

// discard removes everything of a sandbox whose creation was refused before it ever ran: its
// host directory, its perimeter and its record.
func (g *Service) discard(ctx context.Context, sb *api.Sandbox) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := g.vmm(sb.Host).Remove(rctx, sb.ID); err != nil {
		g.log.Warn().Err(fmt.Errorf("discard %s: %w", sb.Name, err)).Msg("sandbox files not removed")
	}
	g.teardownPerimeter(rctx, sb)
	g.forget(sb)
}

// hostSnapshots is what the vmm of host holds, by name; nil when it does not answer in time.
func (g *Service) hostSnapshots(ctx context.Context, host string) map[string]vmmapi.SnapshotInfo {
	lctx, cancel := context.WithTimeout(ctx, statsWait)
	defer cancel()
	list, err := g.vmm(host).Snapshots(lctx)
	if err != nil {
		return nil
	}
	held := make(map[string]vmmapi.SnapshotInfo, len(list))
	for _, info := range list {
		held[info.Name] = info
	}
	return held
}

// orphanAge is how old a snapshot without a record must be before the periodic reconcile
// removes it: a snapshot create may take SnapshotTimeout, and its record is written after.
var orphanAge = Overdue + api.SnapshotTimeout

// settleSnapshotsOnStart settles the snapshots (settleSnapshots) a previous gateway began, once
// this host's vmm answers (it may be starting too), or gives up at deadline, left to reconcile.
func (g *Service) settleSnapshotsOnStart(ctx context.Context, began, deadline time.Time) {
	for g.hostSnapshots(ctx, g.cfg.Host) == nil {
		if time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	g.settleSnapshots(ctx, began)
}

// settleSnapshots removes the snapshots a vmm holds that have no record (a crash between the
// vmm's copy and the gateway's record: nobody was told it exists, and its name would stay
// taken) if they were begun before before. Each host of a sandbox is asked; one that does not
// answer is settled later.
func (g *Service) settleSnapshots(ctx context.Context, before time.Time) {
	hosts := map[string]bool{g.cfg.Host: true}
	if all, err := g.reg.List(ctx, nil); err == nil {
		for _, sb := range all {
			hosts[sb.Host] = true
		}
	}
	for host := range hosts {
		for name, info := range g.hostSnapshots(ctx, host) {
			if !info.Created.Before(before) {
				continue
			}
			rec, err := g.getSnapshot(ctx, name)
			if err == nil && rec.Host == host || err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = g.vmm(host).SnapshotRemove(rctx, name)
			cancel()
			if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				g.log.Warn().Err(err).Str("snapshot", name).Str("host", host).Msg("recovery: cannot remove a snapshot that has no record")
				continue
			}
			g.log.Info().Str("snapshot", name).Str("host", host).Msg("recovery: removed a snapshot a crash left without a record")
		}
	}
}
