package gateway

import (
	"context"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

func (g *Service) images(ctx context.Context, _ api.Empty) ([]vmmapi.ImageInfo, error) {
	return g.vmm(g.cfg.Host).Images(ctx)
}

// image forwards an image operation to the vmm. A commit of a sandbox's disk goes to the vmm
// of the sandbox's host, by its id, while the sandbox is stopped or running (the vmm flushes
// and pauses it for the copy).
func (g *Service) image(ctx context.Context, r vmmapi.ImageRequest) (vmmapi.ImageInfo, error) {
	if (r.Op == "commit" || r.Op == "layer-save") && r.Sandbox != "" {
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
	if r.Op == "warm" {
		// The template a create with the defaults would restore: its memory and vCPUs, and the
		// default agent profile's live credential share when this host has the directory.
		sh := vmmapi.TemplateShape{Net: true}
		if r.Warm != nil {
			sh = *r.Warm
		}
		if sh.MemoryMiB == 0 {
			sh.MemoryMiB = DefaultMemoryMiB
		}
		if sh.VCPUs == 0 {
			sh.VCPUs = DefaultVCPUs
		}
		if sh.MemoryMiB < 0 || sh.MemoryMiB > MaxMemoryMiB || sh.VCPUs < 0 || sh.VCPUs > MaxVCPUs || sh.DiskMiB < 0 || sh.DiskMiB > api.MaxDiskMiB {
			return vmmapi.ImageInfo{}, errdefs.Invalid("image warm: --memory, --vcpus or --disk is out of range")
		}
		sh.Shares = 0
		if prof, err := profile.Get(profile.DefaultName); err == nil {
			if _, ok := liveCredDir(prof); ok {
				sh.Shares = 1
			}
		}
		r.Warm = &sh
	}
	return g.vmm(g.cfg.Host).Image(ctx, r)
}
