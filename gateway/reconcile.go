package gateway

import (
	"context"
	"encoding/json"
	"errors"
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
		go g.markFailed(ctx, ev.ID, ev.Failed)
	})
}

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
		if err == nil || !errors.Is(err, errdefs.ErrConflict) {
			g.log.Warn().Str("sandbox", sb.Name).Str("reason", reason).Msg("sandbox failed")
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

// reconcile compares the registry with what the vmm of each host runs: a sandbox recorded as
// running whose VM is gone is failed; one left mid-transition by a crash is settled.
func (g *Service) reconcile(ctx context.Context) {
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		g.log.Warn().Err(err).Msg("reconcile: cannot list the registry")
		return
	}
	for _, sb := range all {
		switch sb.State {
		case api.StateRunning, api.StatePaused:
		case api.StateStarting, api.StateStopping:
			// A boot or stop may be under way; judge it only once it is long overdue.
			if time.Since(sb.UpdatedAt) < 5*time.Minute {
				continue
			}
		default:
			continue
		}
		vi, err := g.vmm(sb.Host).Inspect(ctx, sb.ID)
		if err != nil {
			continue // that vmm is not up yet; it reports failures itself when it starts
		}
		switch {
		case sb.State == api.StateStopping && !vi.Running:
			g.reg.Transition(ctx, sb, api.StateStopped, "", nil)
		case !vi.Running:
			g.reg.Transition(ctx, sb, api.StateFailed, "the VM is not running (found by reconcile after a restart)", nil)
		case sb.State == api.StateStarting:
			// The boot finished but its caller's record update was lost: it is running.
			g.reg.Transition(ctx, sb, api.StateRunning, "", nil)
		}
	}
}
