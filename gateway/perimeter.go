package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

// perimeter is what a booting sandbox needs from the egress services.
type perimeter struct {
	netSocket string
	env       map[string]string
	trustCA   []byte
	mounts    []vmmapi.Mount
}

// setupPerimeter asks credbroker, mitm and netstack for a sandbox's egress: placeholders,
// the MITM's policy, and the default-deny network. Mode none gets no network device at all.
func (g *Service) setupPerimeter(ctx context.Context, sb *api.Sandbox, prof profile.Profile, plan *egressPlan) (*perimeter, error) {
	p := &perimeter{env: map[string]string{}}
	for k, v := range prof.GuestEnv {
		p.env[k] = v
	}
	if dir, ok := liveCredDir(prof); ok {
		// The profile's credential directory is live-mounted read-write (claude-code: ~/.claude)
		// when the host has one; the guardian keeps its token fresh.
		p.mounts = append(p.mounts, vmmapi.Mount{Host: dir, Guest: prof.GuestCredPath, Remount: true})
		g.cred().Guard(ctx, sb.ID)
	}
	if plan.egress.Mode == api.EgressNone {
		return p, nil
	}
	token := randomHex(32)
	if plan.egress.Mode == api.EgressCurated {
		var creds []mitmapi.CredentialBinding
		if b := plan.bindings(); len(b) > 0 {
			minted, err := g.cred().Mint(ctx, credapi.MintRequest{SandboxID: sb.ID, Bindings: b})
			if err != nil {
				return nil, err
			}
			for k, v := range minted.Env {
				p.env[k] = v
			}
			creds = minted.Credentials
		}
		pol := mitmapi.SandboxPolicy{ID: sb.ID, Name: sb.Name, TokenHash: mitmapi.HashHex(token), AllowedHosts: plan.hosts, Credentials: creds,
			AllowPrivate: plan.egress.AllowPrivate, DeniedHosts: plan.deny}
		if req := requestPolicy(sb); !req.Empty() {
			pol.Requests = &req
		}
		if _, err := mitmapi.NewClient(g.cfg.Bus, sb.Host).Register(ctx, pol); err != nil {
			return nil, err
		}
		ca, err := mitmapi.NewClient(g.cfg.Bus, sb.Host).CACert(ctx)
		if err != nil {
			return nil, err
		}
		p.trustCA = []byte(ca.PEM)
		for _, v := range prof.CACertEnvVars {
			p.env[v] = vmmapi.CAPath
		}
	}
	if sb.Host == g.cfg.Host {
		p.netSocket = filepath.Join(g.cfg.Home.Sandbox(sb.ID), "net.sock")
	} // else the sandbox's host puts it in its own home, which this one cannot name
	spec := netapi.Spec{
		SandboxID: sb.ID, SandboxName: sb.Name, SocketPath: p.netSocket, ProxyToken: token, Dial: true, Limits: plan.egress.Limits,
		Policy: plan.netPolicy(), GuestMAC: vmmapi.MACFor(sb.ID),
	}
	info, err := netapi.NewClient(g.cfg.Bus, sb.Host).Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	if p.netSocket == "" {
		if info.SocketPath == "" {
			return nil, errdefs.Unavailable("the netstack of host %s named no socket for sandbox %s: is it from an older nexus?", sb.Host, sb.Name)
		}
		p.netSocket = info.SocketPath
	}
	return p, nil
}

// teardownPerimeter releases what setupPerimeter made; each service is asked even if another
// fails, and absent state is not an error.
func (g *Service) teardownPerimeter(ctx context.Context, sb *api.Sandbox) error {
	var errs []error
	if err := netapi.NewClient(g.cfg.Bus, sb.Host).Remove(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		errs = append(errs, err)
	}
	if err := mitmapi.NewClient(g.cfg.Bus, sb.Host).Forget(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		errs = append(errs, err)
	}
	if err := g.cred().Forget(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// liveCredDir is the host directory a profile live-mounts (claude-code: ~/.claude), when it
// has one and this host has it.
func liveCredDir(prof profile.Profile) (string, bool) {
	if !prof.CredDirLiveMount {
		return "", false
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return "", false
	}
	dir := filepath.Join(h, prof.CredDir)
	fi, err := os.Stat(dir)
	return dir, err == nil && fi.IsDir()
}
