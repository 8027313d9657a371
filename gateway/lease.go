package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// The lease watchdog (DESIGN §2, KV nexus_leases): an ephemeral sandbox lives only while the
// caller that launched it refreshes the lease key <sandbox id>. The sweep keeps no state of its
// own — it reads the registry's watched cache and a watched cache of the bucket (registry_cache.go),
// not every record per sweep, and confirms a lapsed lease with a read of its key before it acts —
// so a restarted gateway picks up where the last one stopped.
var (
	// LeaseSweepEvery is how often ephemeral sandboxes are checked.
	LeaseSweepEvery = time.Second
	// LeaseGrace is how long an ephemeral sandbox may go without a lease after it became
	// running (or failed): the caller takes its lease right after create returns.
	LeaseGrace = 10 * time.Second
	// LeaseStuckBoot is how long a boot or a stop may take before the watchdog steps in.
	LeaseStuckBoot = api.CreateTimeout + time.Minute
	// LeaseStuckRemove is how long a removal may take before the watchdog drives it again
	// (its gateway died midway).
	LeaseStuckRemove = time.Minute
)

type leaseWatchdog struct {
	ctx    context.Context // the watchdog's life; removals end with it
	since  time.Time       // when this watchdog started
	g      *Service
	kv     jetstream.KeyValue
	leases *registryCache // the bucket, as a watch delivers it: when each lease was last refreshed
	mu     sync.Mutex
	active map[string]bool // sandbox ids being removed by this process
	wg     sync.WaitGroup
}

// watchLeases sweeps ephemeral sandboxes every LeaseSweepEvery until ctx ends, and waits for
// the removals it started.
func (g *Service) watchLeases(ctx context.Context) {
	w := &leaseWatchdog{ctx: ctx, since: time.Now(), g: g, active: map[string]bool{}}
	defer w.wg.Wait()
	t := time.NewTicker(LeaseSweepEvery)
	defer t.Stop()
	for {
		if w.kv == nil {
			kv, err := bus.KV(ctx, g.cfg.Bus, bus.KVLeases)
			if err != nil {
				g.log.Warn().Err(err).Msg("lease watchdog: cannot bind the leases bucket")
			}
			w.kv = kv
			if kv != nil {
				w.leases = newRegistryCache()
				go followKV(ctx, g.cfg.Bus, kv, w.leases)
			}
		}
		if w.kv != nil {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			w.sweep(sctx, time.Now())
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweep removes every ephemeral sandbox past its grace whose lease key is gone. For LeaseGrace
// after the watchdog starts it removes nothing: when the bus itself restarted, leases may have
// lapsed while it was down, and live callers need a moment to reconnect and refresh them.
func (w *leaseWatchdog) sweep(ctx context.Context, now time.Time) {
	if now.Sub(w.since) < LeaseGrace {
		return
	}
	all, err := w.g.reg.View(ctx, nil) // read only: a sandbox to remove is copied first
	if err != nil {
		w.g.log.Warn().Err(err).Msg("lease watchdog: cannot list the registry")
		return
	}
	for _, view := range all {
		if w.busy(view.ID) {
			continue
		}
		sb := func() *api.Sandbox { cp := *view; return &cp }
		if expired(view, now) {
			w.remove(sb(), fmt.Sprintf("its --ttl expired at %s", view.ExpiresAt.Format(time.RFC3339)))
			continue
		}
		if !view.Ephemeral || !dueForLeaseCheck(view, now) {
			continue
		}
		if at, ok := w.leases.storedAt(view.ID); ok && now.Sub(at) < bus.LeaseTTL-time.Second {
			continue // refreshed lately, as the watch saw it
		}
		_, err := w.kv.Get(ctx, view.ID)
		if err == nil {
			continue // the caller is alive
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			// The bucket did not answer: never remove a sandbox on a guess.
			w.g.log.Warn().Err(err).Str("sandbox", view.Name).Msg("lease watchdog: cannot read the lease")
			continue
		}
		w.remove(sb(), "it lost its caller's lease (ephemeral)")
	}
}

// expired reports whether sb has outlived its --ttl. A removal under way is driven by the
// lease rules (LeaseStuckRemove), not again at every sweep.
func expired(sb *api.Sandbox, now time.Time) bool {
	return !sb.ExpiresAt.IsZero() && !now.Before(sb.ExpiresAt) &&
		(sb.State != api.StateRemoving || now.Sub(sb.UpdatedAt) >= LeaseStuckRemove)
}

// dueForLeaseCheck reports whether sb has been without a caller long enough to be judged: a
// running or paused sandbox LeaseGrace after it started, a failed or stopped one LeaseGrace
// after it settled, a boot or a removal only when it is overdue (its gateway died).
func dueForLeaseCheck(sb *api.Sandbox, now time.Time) bool {
	since := sb.UpdatedAt
	grace := LeaseGrace
	switch sb.State {
	case api.StateRunning, api.StatePaused:
		if !sb.StartedAt.IsZero() {
			since = sb.StartedAt
		}
	case api.StateFailed, api.StateStopped, api.StateCreated:
	case api.StateRemoving:
		grace = LeaseStuckRemove
	default: // starting, stopping: someone is working on it
		grace = LeaseStuckBoot
	}
	return now.Sub(since) >= grace
}

func (w *leaseWatchdog) busy(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.active[id]
}

// remove tears the sandbox down in the background (force: it is running) and forgets it; why
// is the reason its removing transition carries on the event stream. The gateway's remove
// waits for the VM to exit and the perimeter to be torn down.
func (w *leaseWatchdog) remove(sb *api.Sandbox, why string) {
	w.mu.Lock()
	w.active[sb.ID] = true
	w.mu.Unlock()
	w.g.log.Info().Str("sandbox", sb.Name).Str("id", sb.ID).Str("state", string(sb.State)).Str("reason", why).
		Msg("removing sandbox")
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer func() {
			w.mu.Lock()
			delete(w.active, sb.ID)
			w.mu.Unlock()
		}()
		rctx, cancel := context.WithTimeout(w.ctx, 2*time.Minute)
		defer cancel()
		err := w.g.removeBecause(rctx, sb, why)
		switch {
		case err == nil:
			w.g.log.Info().Str("sandbox", sb.Name).Str("reason", why).Msg("sandbox removed")
		case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrConflict):
			// Its caller removed it meanwhile, or changed it: the next sweep looks again.
		default:
			w.g.log.Warn().Err(err).Str("sandbox", sb.Name).Msg("lease watchdog: remove failed; retrying on the next sweep")
		}
	}()
}
