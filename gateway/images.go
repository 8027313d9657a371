package gateway

import (
	"context"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

func (g *Service) images(ctx context.Context, _ api.Empty) ([]vmmapi.ImageInfo, error) {
	return g.vmm(g.cfg.Host).Images(ctx)
}

func (g *Service) image(ctx context.Context, r vmmapi.ImageRequest) (vmmapi.ImageInfo, error) {
	return g.vmm(g.cfg.Host).Image(ctx, r)
}
