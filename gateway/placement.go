package gateway

import (
	"context"
	"fmt"
	"strings"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

// place picks the host of a new sandbox (DESIGN §10). What lives on one host pins it to the
// gateway's host: --mount paths and a profile that live-mounts the host's credential directory
// (~/.claude). Otherwise --host, or among the hosts up and undrained whose heartbeat has the
// --host-label labels, the one with the most free memory that fits. Without heartbeats (a bus
// from before them) or with this host alone it is the gateway's host, as on a single machine.
func (g *Service) place(ctx context.Context, sb *api.Sandbox, r api.CreateRequest, prof profile.Profile) error {
	pin := ""
	switch {
	case len(sb.Mounts) > 0:
		pin = "its --mount paths are on host " + g.cfg.Host
	default:
		if _, live := liveCredDir(prof); live {
			pin = "agent " + prof.Name + " live-mounts ~/" + prof.CredDir + " of host " + g.cfg.Host
		}
	}
	hosts := g.hostStates(ctx)
	known := func(name string) (bus.HostState, bool) {
		for _, h := range hosts {
			if h.Host == name {
				return h, true
			}
		}
		return bus.HostState{}, false
	}
	if pin != "" {
		if (r.Host != "" && r.Host != g.cfg.Host) || len(r.HostLabels) > 0 {
			return errdefs.Invalid("sandbox %s cannot be placed as asked: %s, so it runs there or nowhere", sb.Name, pin)
		}
		sb.Host = g.cfg.Host
		return nil
	}
	if r.Host != "" {
		h, ok := known(r.Host)
		switch {
		case r.Host == g.cfg.Host && !ok:
		case !ok:
			return errdefs.NotFound("no host %s in the cluster (nexus hosts lists them)", r.Host)
		case h.State != bus.HostUp:
			return errdefs.Unavailable("host %s is %s: nothing new is placed there", r.Host, h.State)
		}
		if ok && !hasLabels(h.Labels, r.HostLabels) {
			return errdefs.Invalid("host %s lacks the labels asked for (%s)", r.Host, labelText(r.HostLabels))
		}
		sb.Host = r.Host
		return nil
	}
	if len(hosts) == 0 || (len(hosts) == 1 && hosts[0].Host == g.cfg.Host && len(r.HostLabels) == 0) {
		sb.Host = g.cfg.Host
		return nil
	}
	host, ok, why := bus.Place(hosts, sb.MemoryMiB, r.HostLabels)
	if !ok {
		return errdefs.Refused("no host can take sandbox %s (%d MiB%s): %s", sb.Name, sb.MemoryMiB, labelSuffix(r.HostLabels), strings.Join(why, "; "))
	}
	sb.Host = host
	return nil
}

// hostStates are the hosts' heartbeats now; nil when there are none or the bus has no bucket.
func (g *Service) hostStates(ctx context.Context) []bus.HostState {
	sctx, cancel := bus.StoreContext(ctx)
	defer cancel()
	kv, err := bus.KV(sctx, g.cfg.Bus, bus.KVHosts)
	if err != nil {
		return nil
	}
	hs, err := bus.Hosts(sctx, kv, time.Now())
	if err != nil {
		g.log.Warn().Err(err).Msg("host heartbeats")
		return nil
	}
	return hs
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func labelText(m map[string]string) string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%s", k, v))
	}
	return strings.Join(out, ",")
}

func labelSuffix(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	return ", labels " + labelText(m)
}
