package gateway

import (
	"context"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
)

// ports asks the port forwarder of the sandbox's host for its forwards and conflicts; without
// a name, those of every sandbox on this gateway's host.
func (g *Service) ports(ctx context.Context, r api.PortsRequest) ([]portfwdapi.Forward, error) {
	host, req := g.cfg.Host, portfwdapi.ListRequest{}
	if r.Name != "" {
		name, err := api.ParseName(r.Name)
		if err != nil {
			return nil, err
		}
		sb, err := g.reg.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		host, req.ID = sb.Host, sb.ID
	}
	return portfwdapi.NewClient(g.cfg.Bus, host).List(ctx, req)
}
