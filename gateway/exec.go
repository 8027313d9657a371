package gateway

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

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
	if pausedForIdle(sb) {
		if err := g.resume(ctx, sb, false); err != nil {
			return nil, fmt.Errorf("resume idle sandbox %s: %w", sb.Name, err)
		}
	}
	if sb.State == api.StateRunning {
		g.touch(sb.ID)
	}
	if sb.State == api.StatePaused {
		return nil, errdefs.Conflict("sandbox %s is paused: resume it with `nexus resume %s`", sb.Name, sb.Name)
	}
	if sb.State != api.StateRunning {
		return nil, errdefs.Conflict("sandbox %s is %s, not running: start it with `nexus start %s`", sb.Name, sb.State, sb.Name)
	}
	return sb, nil
}

// exec and copy start a session on the caller's stream at the vmm of the sandbox's host, and
// name that host: the caller's stream then hears no other host's vmm on the same session id.
func (g *Service) exec(ctx context.Context, r api.ExecRequest) (api.Started, error) {
	sb, err := g.running(ctx, r.Name)
	if err != nil {
		return api.Started{}, err
	}
	if err := g.vmm(sb.Host).Exec(ctx, vmmapi.ExecRequest{
		ID: sb.ID, SID: r.SID, Argv: r.Argv, Env: r.Env, Dir: r.Dir, TTY: r.TTY, Rows: r.Rows, Cols: r.Cols,
		Stdin: r.Stdin, Timeout: r.Timeout, User: r.User,
	}); err != nil {
		return api.Started{}, g.onLostHost(ctx, sb.Host, "exec in "+sb.Name, err)
	}
	return api.Started{Host: sb.Host}, nil
}

func (g *Service) copy(ctx context.Context, r api.CopyRequest) (api.Started, error) {
	sb, err := g.running(ctx, r.Name)
	if err != nil {
		return api.Started{}, err
	}
	if err := g.vmm(sb.Host).Copy(ctx, vmmapi.CopyRequest{ID: sb.ID, SID: r.SID, ToGuest: r.ToGuest, Path: r.Path, Mode: r.Mode, Size: r.Size}); err != nil {
		return api.Started{}, g.onLostHost(ctx, sb.Host, "cp with "+sb.Name, err)
	}
	return api.Started{Host: sb.Host}, nil
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
	return api.LogsResponse{Data: resp.Data, NextOffset: resp.NextOffset}, g.onLostHost(ctx, sb.Host, "logs of "+sb.Name, err)
}

// ranIn is how a command the gateway ran in a sandbox ended, with the first outputLimit bytes
// of each stream.
type ranIn struct {
	exit           vmmapi.Exit
	stdout, stderr headBuffer
}

// outputLimit bounds what runIn keeps of a stream: its commands print a line or two.
const outputLimit = 64 << 10

// headBuffer keeps the first outputLimit bytes written to it.
type headBuffer struct{ bytes.Buffer }

func (b *headBuffer) Write(p []byte) (int, error) {
	b.Buffer.Write(p[:min(len(p), max(0, outputLimit-b.Len()))])
	return len(p), nil
}

// runIn runs a command of the gateway's own in a running sandbox (stdin, when set, is written
// to it and closed) and waits for it; the guest kills it after timeout.
func (g *Service) runIn(ctx context.Context, req api.ExecRequest, stdin *string, timeout time.Duration) (*ranIn, error) {
	req.Timeout, req.Stdin = timeout.String(), stdin != nil
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	res := &ranIn{}
	pipes := api.IO{Stdout: &res.stdout, Stderr: &res.stderr}
	if stdin != nil {
		pipes.Stdin = strings.NewReader(*stdin)
	}
	exit, err := api.RunSession(ctx, g.cfg.Bus, req, g.exec, pipes)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errdefs.Unavailable("exec in %s: no exit status after %s: the sandbox stopped answering", req.Name, timeout)
		}
		return nil, fmt.Errorf("exec in %s: %w", req.Name, err)
	}
	res.exit = exit
	return res, nil
}
