package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/gateway/cli"
	"github.com/IniZio/nexus/gateway/httpapi"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/settings"
	"github.com/IniZio/nexus/pkg/version"
)

// apiName is `nexus serve api`: the HTTP API, a client of the gateway like the CLI (bus user
// cli), so it is not one of bus.Services and `nexus up` runs it only when --api is given.
const apiName = "api"

// runAPI serves the HTTP API at addr (the settings' --api, else its default), dialling the bus
// at url (empty: the one the settings find) as user api (bus.UserAPI), the one user that may write its request audit.
func runAPI(ctx context.Context, g *cli.Global, url string) error {
	addr := g.Settings.APIAddr
	if addr == "" {
		addr = settings.DefaultAPIAddr
	}
	log := g.Log.With().Str("service", apiName).Logger()
	svc, err := httpapi.New(httpapi.Config{
		Addr: addr, TLSCert: g.Settings.APITLSCert, TLSKey: g.Settings.APITLSKey,
		Home: g.Home, Log: log, Version: version.Version,
		Build: func(ctx context.Context, b httpapi.DockerBuild) (vmmapi.ImageInfo, error) {
			busURL := url
			if busURL == "" {
				busURL = g.Settings.BusURL
			}
			return runDockerBuild(ctx, g, busURL, b)
		},
		Dial: func(ctx context.Context) (*nats.Conn, error) {
			cfg := g.Bus(bus.UserAPI)
			cfg.Reconnect = true
			if url != "" {
				cfg.URL = url
			}
			return bus.Connect(ctx, cfg)
		},
	})
	if err != nil {
		return cli.StartupError(err)
	}
	return svc.Run(ctx)
}

// runDockerBuild runs an API's Dockerfile build as `nexus image build -f` (this binary, as the
// CLI user, on the same home and bus), so that the API builds exactly as the CLI does. The
// build args reach it in its environment (--build-arg NAME), never on its command line.
func runDockerBuild(ctx context.Context, g *cli.Global, url string, b httpapi.DockerBuild) (vmmapi.ImageInfo, error) {
	exe, err := os.Executable()
	if err != nil {
		return vmmapi.ImageInfo{}, err
	}
	args := []string{"--home", string(g.Home)}
	if url != "" {
		args = append(args, "--bus-url", url)
	}
	args = append(args, "image", "build", "--json", "-f", filepath.Join(b.Context, filepath.FromSlash(b.File)), "--tag", b.Tag)
	env := os.Environ()
	for k, v := range b.BuildArgs {
		taken := strings.HasPrefix(k, "NEXUS_")
		for _, e := range env {
			taken = taken || strings.HasPrefix(e, k+"=")
		}
		if taken {
			return vmmapi.ImageInfo{}, errdefs.Invalid("build_arg %s: the name is one of the API server's own environment; use another", k)
		}
		args = append(args, "--build-arg", k)
		env = append(env, k+"="+v)
	}
	for _, h := range b.AllowHosts {
		args = append(args, "--allow-host", h)
	}
	if b.MemoryMiB > 0 {
		args = append(args, "--memory", strconv.Itoa(b.MemoryMiB))
	}
	if b.NoCache {
		args = append(args, "--no-cache")
	}
	cmd := exec.CommandContext(ctx, exe, append(args, b.Context)...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var info vmmapi.ImageInfo
	if runErr == nil && json.Unmarshal(stdout.Bytes(), &info) == nil {
		return info, nil
	}
	// The CLI's --json error: {"error":{"code","message"}}, the last line of its stderr.
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	var eb struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.Unmarshal([]byte(lines[len(lines)-1]), &eb) == nil && eb.Error.Message != "" {
		return vmmapi.ImageInfo{}, errdefs.FromCode(eb.Error.Code, eb.Error.Message)
	}
	if ctx.Err() != nil {
		return vmmapi.ImageInfo{}, errdefs.Unavailable("image build: %v", ctx.Err())
	}
	return vmmapi.ImageInfo{}, fmt.Errorf("image build: %v", runErr)
}
