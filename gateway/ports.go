package gateway

import (
	"cmp"
	"context"
	"slices"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
)

// ports asks the port forwarder of the sandbox's host for its forwards and conflicts; without
// a name, the forwarder of every host a sandbox is on (and this gateway's), each row naming its
// host. A host that does not answer within statsWait is left out of a listing of all.
func (g *Service) ports(ctx context.Context, r api.PortsRequest) ([]portfwdapi.Forward, error) {
	if r.Name != "" {
		name, err := api.ParseName(r.Name)
		if err != nil {
			return nil, err
		}
		sb, err := g.reg.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		list, err := portfwdapi.NewClient(g.cfg.Bus, sb.Host).List(ctx, portfwdapi.ListRequest{ID: sb.ID})
		return list, g.onLostHost(ctx, sb.Host, "ports of "+sb.Name, err)
	}
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	// This host first: its forwarder's error is the answer when it is the only one.
	hosts := append([]*api.Sandbox{{Host: g.cfg.Host}}, all...)
	var out []portfwdapi.Forward
	var first error
	eachHost(ctx, hosts, func(ctx context.Context, host string) {
		list, err := portfwdapi.NewClient(g.cfg.Bus, host).List(ctx, portfwdapi.ListRequest{})
		if err != nil {
			if host == g.cfg.Host {
				first = err
			}
			return
		}
		for _, f := range list {
			if f.Host == "" {
				f.Host = host
			}
			out = append(out, f)
		}
	})
	if out == nil && first != nil {
		return nil, first
	}
	slices.SortStableFunc(out, func(a, b portfwdapi.Forward) int {
		return cmp.Or(cmp.Compare(a.Sandbox, b.Sandbox), cmp.Compare(a.Port, b.Port))
	})
	return out, nil
}
