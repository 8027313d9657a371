package gateway

import (
	"context"
	"regexp"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/errdefs"
)

var secretNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,63}$`)

func (g *Service) secretSet(ctx context.Context, r credapi.SecretSetRequest) (api.Empty, error) {
	if !secretNameRE.MatchString(r.Name) {
		return api.Empty{}, errdefs.Invalid("invalid secret name %q: use letters, digits, '_', '.', '-' (at most 64)", r.Name)
	}
	return api.Empty{}, g.cred().SecretSet(ctx, r)
}

func (g *Service) secretList(ctx context.Context, _ api.Empty) (credapi.SecretListResponse, error) {
	return g.cred().SecretList(ctx)
}

func (g *Service) secretRemove(ctx context.Context, r credapi.SecretRemoveRequest) (api.Empty, error) {
	return api.Empty{}, g.cred().SecretRemove(ctx, r.Name)
}

func (g *Service) egressShow(ctx context.Context, r api.NameRequest) (api.EgressView, error) {
	name, err := api.ParseName(r.Name)
	if err != nil {
		return api.EgressView{}, err
	}
	sb, err := g.reg.Get(ctx, name)
	if err != nil {
		return api.EgressView{}, err
	}
	v := api.EgressView{Sandbox: sb.Name, Egress: sb.Egress}
	for _, s := range sb.Secrets {
		v.Secrets = append(v.Secrets, s.Name)
	}
	if info, err := netapi.NewClient(g.cfg.Bus, sb.Host).Show(ctx, sb.ID); err == nil {
		v.Network = &info
	}
	v.AuditLimited = g.auditLimits(ctx, sb.ID)[sb.ID]
	return v, nil
}
