package gateway

import (
	"context"
	"strings"
	"sync"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
)

// Idle handling (--idle-timeout): a running sandbox with no exec, attach or copy (started or
// still running), no network traffic and no open connection, no port-forwarded connection
// (open, or taken since the last sample), whose VM used under IdleCPUPercent of its vCPUs at every
// sample for the whole timeout, is paused; the next exec, attach or copy resumes it. What was
// last seen lives in this process only: a restarted gateway starts every clock again, which
// can only delay a pause.
var (
	// IdleSweepEvery is how often idle sandboxes are sampled.
	IdleSweepEvery = 5 * time.Second
	// IdleCPUPercent is the CPU share (of the sandbox's vCPUs) under which a guest counts as idle.
	IdleCPUPercent = 5.0
)

// idleReason starts the reason of a pause that idle handling made; only such a pause is undone
// by the next exec.
const idleReason = "idle: no activity for "

type idleSample struct {
	at, active    time.Time
	cpu           float64 // host CPU seconds of the VM
	gbusy, gtotal uint64  // the guest's own CPU ticks
	net           uint64
	ports         uint64 // connections its port forwards took, all told
}

type idleWatch struct {
	mu   sync.Mutex
	last map[string]idleSample // sandbox id → what the last sweep saw
}

// touch records activity from a caller (exec, attach, copy) on sandbox id.
func (g *Service) touch(id string) {
	w := g.idle
	w.mu.Lock()
	defer w.mu.Unlock()
	if s, ok := w.last[id]; ok {
		s.active = time.Now()
		w.last[id] = s
	}
}

// watchIdle sweeps every IdleSweepEvery until ctx ends.
func (g *Service) watchIdle(ctx context.Context) {
	every(ctx, IdleSweepEvery, func(ctx context.Context) { g.sweepIdle(ctx, time.Now()) })
}

// every runs fn after each period d until ctx ends, each run under a 30 s deadline.
func every(ctx context.Context, d time.Duration, fn func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		fn(rctx)
		cancel()
	}
}

// sweepIdle samples every running sandbox that has an idle timeout and pauses those idle for it.
func (g *Service) sweepIdle(ctx context.Context, now time.Time) {
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		return
	}
	var names []string
	timeouts := map[string]time.Duration{}
	records := map[string]*api.Sandbox{}
	for _, sb := range all {
		if sb.IdleTimeout == "" || sb.State != api.StateRunning {
			continue
		}
		d, err := api.ParseLifetime("idle-timeout", sb.IdleTimeout)
		if err != nil {
			continue
		}
		names = append(names, sb.Name)
		timeouts[sb.ID], records[sb.ID] = d, sb
	}
	w := g.idle
	w.mu.Lock()
	for id := range w.last {
		if _, ok := timeouts[id]; !ok {
			delete(w.last, id) // paused, stopped or gone: its clock starts again when it runs
		}
	}
	w.mu.Unlock()
	if len(names) == 0 {
		return
	}
	stats, err := g.stats(ctx, api.StatsRequest{Names: names})
	if err != nil {
		return
	}
	var watched []*api.Sandbox
	for _, sb := range records {
		watched = append(watched, sb)
	}
	ports := g.portActivity(ctx, watched)
	for _, st := range stats {
		if st.State != api.StateRunning {
			continue
		}
		net := st.NetOutBytes + st.NetInBytes
		pa := ports[st.ID]
		w.mu.Lock()
		prev, seen := w.last[st.ID]
		cur := idleSample{at: now, active: prev.active, cpu: st.CPUSeconds, gbusy: st.GuestCPUBusy, gtotal: st.GuestCPUTotal, net: net, ports: pa.accepted}
		switch {
		case !seen:
			cur.active = now
		case net != prev.net || st.Connections > 0 || st.Execs > 0 || pa.open > 0 || pa.accepted != prev.ports:
			cur.active = now
		case busyPercent(prev, cur, st.VCPUs) >= IdleCPUPercent:
			cur.active = now
		}
		w.last[st.ID] = cur
		w.mu.Unlock()
		if d := timeouts[st.ID]; now.Sub(cur.active) >= d {
			sb := records[st.ID]
			why := idleReason + d.String() + " (--idle-timeout)"
			if err := g.pauseBecause(ctx, sb, why); err != nil {
				g.log.Warn().Err(err).Str("sandbox", sb.Name).Msg("idle: cannot pause")
				continue
			}
			g.log.Info().Str("sandbox", sb.Name).Str("reason", why).Msg("paused an idle sandbox")
		}
	}
}

// portUse is what the port forwards of one sandbox relay: connections open now and taken so far.
type portUse struct {
	open     int
	accepted uint64
}

// portActivity asks the port forwarder of each host the sandboxes are on what their forwards
// relay, by sandbox id; a host that does not answer within statsWait counts as no activity.
func (g *Service) portActivity(ctx context.Context, sandboxes []*api.Sandbox) map[string]portUse {
	out := map[string]portUse{}
	eachHost(ctx, sandboxes, func(ctx context.Context, host string) {
		fwds, err := portfwdapi.NewClient(g.cfg.Bus, host).List(ctx, portfwdapi.ListRequest{})
		if err != nil {
			return
		}
		for _, f := range fwds {
			u := out[f.ID]
			u.open += f.Conns
			u.accepted += f.Accepted
			out[f.ID] = u
		}
	})
	return out
}

// busyPercent is how busy the guest was between two samples, as a share of its vCPUs: from the
// guest kernel's own ticks when its agent reports them, else from the host CPU its VM used
// (which, under TCG, counts the emulation of an idle guest too).
func busyPercent(prev, cur idleSample, vcpus int) float64 {
	if cur.gtotal > prev.gtotal && prev.gtotal > 0 && cur.gbusy >= prev.gbusy {
		return 100 * float64(cur.gbusy-prev.gbusy) / float64(cur.gtotal-prev.gtotal)
	}
	if wall := cur.at.Sub(prev.at).Seconds(); wall > 0 && cur.cpu >= prev.cpu {
		return 100 * (cur.cpu - prev.cpu) / (wall * float64(max(vcpus, 1)))
	}
	return 0
}

// pauseBecause pauses sb on nexus's own initiative, why on the event stream and in the record.
func (g *Service) pauseBecause(ctx context.Context, sb *api.Sandbox, why string) error {
	if err := g.vmm(sb.Host).Pause(ctx, sb.ID); err != nil {
		return err
	}
	return g.reg.Transition(ctx, sb, api.StatePaused, why, nil)
}

// pausedForIdle reports whether sb is paused because it was idle: the next exec resumes it.
func pausedForIdle(sb *api.Sandbox) bool {
	return sb.State == api.StatePaused && strings.HasPrefix(sb.Reason, idleReason)
}
