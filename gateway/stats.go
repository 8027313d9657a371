package gateway

import (
	"context"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// statsWait bounds each service's answer to a sample: a host that does not answer leaves its
// figures at zero rather than holding the whole sample.
const statsWait = 2 * time.Second

// stats samples what the named (or selected, or all) running and paused sandboxes use: CPU
// time, memory and disk from their host's vmm, network from its netstack.
func (g *Service) stats(ctx context.Context, r api.StatsRequest) ([]api.SandboxStats, error) {
	if len(r.Names) > 0 && len(r.Selector) > 0 {
		return nil, errdefs.Invalid("name sandboxes or select them with -l, not both")
	}
	var targets []*api.Sandbox
	if len(r.Names) > 0 {
		for _, n := range r.Names {
			name, err := api.ParseName(n)
			if err != nil {
				return nil, err
			}
			sb, err := g.reg.Get(ctx, name)
			if err != nil {
				return nil, err
			}
			targets = append(targets, sb)
		}
	} else {
		sel, err := api.ParseSelector(r.Selector...)
		if err != nil {
			return nil, err
		}
		all, err := g.reg.List(ctx, sel)
		if err != nil {
			return nil, err
		}
		for _, sb := range all {
			if sb.State == api.StateRunning || sb.State == api.StatePaused {
				targets = append(targets, sb)
			}
		}
	}
	vms := g.vmInfos(ctx, targets)
	out := []api.SandboxStats{}
	for _, sb := range targets {
		vi := vms[sb.ID]
		st := api.SandboxStats{Name: sb.Name, ID: sb.ID, State: sb.State, Time: time.Now().UTC(),
			CPUSeconds: vi.CPUSeconds, VCPUs: sb.VCPUs, MemoryMiB: sb.MemoryMiB, GuestMemUsedBytes: vi.GuestMemUsedBytes, RSSBytes: vi.RSSBytes,
			DiskUsedBytes: vi.DiskUsedBytes, DiskSizeBytes: vi.DiskSizeBytes, Execs: vi.Execs,
			GuestCPUBusy: vi.GuestCPUBusy, GuestCPUTotal: vi.GuestCPUTotal}
		if sb.Egress.Mode != "" && sb.Egress.Mode != api.EgressNone {
			nctx, cancel := context.WithTimeout(ctx, statsWait)
			if info, err := netapi.NewClient(g.cfg.Bus, sb.Host).Show(nctx, sb.ID); err == nil {
				st.NetOutBytes, st.NetInBytes, st.Connections = info.Counters.BytesOut, info.Counters.BytesIn, info.Counters.Flows
			}
			cancel()
		}
		out = append(out, st)
	}
	return out, nil
}
