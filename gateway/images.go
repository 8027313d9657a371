package gateway

import (
	"context"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
)

func (g *Service) images(ctx context.Context, _ api.Empty) ([]vmmapi.ImageInfo, error) {
	return g.vmm(g.cfg.Host).Images(ctx)
}

// image forwards an image operation to the vmm. A commit of a sandbox's disk goes to the vmm
// of the sandbox's host, by its id, while the sandbox is stopped or running (the vmm flushes
// and pauses it for the copy).
func (g *Service) image(ctx context.Context, r vmmapi.ImageRequest) (vmmapi.ImageInfo, error) {
	if r.Op == "commit" && r.Sandbox != "" {
		n, err := api.ParseName(r.Sandbox)
		if err != nil {
			return vmmapi.ImageInfo{}, err
		}
		sb, err := g.reg.Get(ctx, n)
		if err != nil {
			return vmmapi.ImageInfo{}, err
		}
		if sb.State != api.StateStopped && sb.State != api.StateRunning {
			return vmmapi.ImageInfo{}, errdefs.Conflict("sandbox %s is %s: an image is made of a running or a stopped sandbox's disk", sb.Name, sb.State)
		}
		r.Sandbox = sb.ID
		return g.vmm(sb.Host).Image(ctx, r)
	}
	return g.vmm(g.cfg.Host).Image(ctx, r)
}
