package gateway

import (
	"context"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// running resolves a name to a sandbox that can run commands.
func (g *Service) running(ctx context.Context, name string) (*api.Sandbox, error) {
	n, err := api.ParseName(name)
	if err != nil {
		return nil, err
	}
	sb, err := g.reg.Get(ctx, n)
	if err != nil {
		return nil, err
	}
	if sb.State != api.StateRunning {
		return nil, errdefs.Conflict("sandbox %s is %s, not running: start it with `nexus start %s`", sb.Name, sb.State, sb.Name)
	}
	return sb, nil
}

func (g *Service) exec(ctx context.Context, r api.ExecRequest) (api.Empty, error) {
	sb, err := g.running(ctx, r.Name)
	if err != nil {
		return api.Empty{}, err
	}
	return api.Empty{}, g.vmm(sb.Host).Exec(ctx, vmmapi.ExecRequest{
		ID: sb.ID, SID: r.SID, Argv: r.Argv, Env: r.Env, Dir: r.Dir, TTY: r.TTY, Rows: r.Rows, Cols: r.Cols,
		Stdin: r.Stdin, Timeout: r.Timeout,
	})
}

func (g *Service) copy(ctx context.Context, r api.CopyRequest) (api.Empty, error) {
	sb, err := g.running(ctx, r.Name)
	if err != nil {
		return api.Empty{}, err
	}
	return api.Empty{}, g.vmm(sb.Host).Copy(ctx, vmmapi.CopyRequest{ID: sb.ID, SID: r.SID, ToGuest: r.ToGuest, Path: r.Path, Mode: r.Mode, Size: r.Size})
}

func (g *Service) logs(ctx context.Context, r api.LogsRequest) (api.LogsResponse, error) {
	n, err := api.ParseName(r.Name)
	if err != nil {
		return api.LogsResponse{}, err
	}
	sb, err := g.reg.Get(ctx, n)
	if err != nil {
		return api.LogsResponse{}, err
	}
	resp, err := g.vmm(sb.Host).Logs(ctx, vmmapi.LogsRequest{ID: sb.ID, Offset: r.Offset, Max: r.Max, Agent: r.Agent})
	return api.LogsResponse{Data: resp.Data, NextOffset: resp.NextOffset}, err
}
