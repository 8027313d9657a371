package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/IniZio/nexus/gateway"
	"github.com/IniZio/nexus/gateway/cli"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/failpoint"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/pkg/settings"
	"github.com/IniZio/nexus/pkg/version"
	"github.com/IniZio/nexus/services/credbroker"
	"github.com/IniZio/nexus/services/gitrelay"
	"github.com/IniZio/nexus/services/mitm"
	"github.com/IniZio/nexus/services/netstack"
	"github.com/IniZio/nexus/services/portfwd"
	"github.com/IniZio/nexus/services/vmm"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

// runEnv is what every service gets from the composition root.
type runEnv struct {
	home home.Dir
	host string
	set  *settings.Values
	log  zerolog.Logger
	nc   *nats.Conn
}

// component is one service: its name (also its bus user) and how to build and run it.
type component struct {
	name string
	run  func(ctx context.Context, env runEnv) error
}

// components lists the services of bus.Services after the bus, in their start order (the bus
// is started before any of them).
func components() []component {
	runs := runners()
	var out []component
	for _, name := range bus.Services {
		if name != bus.UserBus {
			out = append(out, component{name: name, run: runs[name]})
		}
	}
	return out
}

// runners says how the composition root builds and runs each service but the bus.
func runners() map[string]func(ctx context.Context, env runEnv) error {
	return map[string]func(ctx context.Context, env runEnv) error{
		bus.UserGateway: func(ctx context.Context, env runEnv) error {
			return run(ctx, gateway.New, gateway.Config{Bus: env.nc, Home: env.home, Host: env.host, Log: env.log, Version: version.Version,
				MetricsAddr: env.set.MetricsAddr, MinFreeDisk: env.set.MinFreeDisk, MCPEgress: env.set.MCPEgress})
		},
		bus.UserVMM: func(ctx context.Context, env runEnv) error {
			return run(ctx, vmm.New, vmm.Config{Bus: env.nc, Home: env.home, Host: env.host, Log: env.log, Version: version.Version,
				CacheDir: env.set.Cache, QEMU: qemu.Config{Accel: env.set.Accel, JailHelper: jailHelper(), Virtiofsd: virtiofsd(env.set.MountFS)}, MinFreeDisk: env.set.MinFreeDisk, Labels: env.set.HostLabels,
				Admission: vmm.Admission{MemoryShare: env.set.MemoryShare, VCPUOvercommit: env.set.VCPUOvercommit}, NoTemplates: env.set.NoTemplates})
		},
		bus.UserNetstack: func(ctx context.Context, env runEnv) error {
			logrus.SetOutput(io.Discard) // gvisor-tap-vsock's switch logs through logrus's global logger
			return run(ctx, netstack.New, netstack.Config{Bus: env.nc, Home: env.home, Host: env.host, Log: env.log, Version: version.Version,
				UpstreamDNS: env.set.UpstreamDNS, Resolve: env.set.Resolve})
		},
		bus.UserMITM: func(ctx context.Context, env runEnv) error {
			return run(ctx, mitm.New, mitm.Config{Bus: env.nc, Home: env.home, Host: env.host, Log: env.log, Version: version.Version,
				Addr: env.set.MITMAddr, Resolve: env.set.Resolve, ExtraRoots: env.set.ExtraRoots})
		},
		bus.UserCredbroker: func(ctx context.Context, env runEnv) error {
			return run(ctx, credbroker.New, credbroker.Config{Bus: env.nc, Home: env.home, Host: env.host, Log: env.log, Version: version.Version,
				TokenURL: env.set.ClaudeTokenURL})
		},
		bus.UserGitrelay: func(ctx context.Context, env runEnv) error {
			hosts, err := gitrelayHosts(env.set)
			if err != nil {
				return err
			}
			return run(ctx, gitrelay.New, gitrelay.Config{Bus: env.nc, Home: env.home, Host: env.host, Log: env.log, Version: version.Version,
				SSH: gitrelay.SSHConfig{Binary: env.set.GitrelaySSH, Options: env.set.GitrelaySSHOpts, Hosts: hosts}})
		},
		bus.UserPortfwd: func(ctx context.Context, env runEnv) error {
			return run(ctx, portfwd.New, portfwd.Config{Bus: env.nc, Home: env.home, Host: env.host, Log: env.log, Version: version.Version})
		},
	}
}

// gitrelayHosts parses --gitrelay-hosts with the relay's own parser.
func gitrelayHosts(v *settings.Values) (map[string]gitrelay.Target, error) {
	hosts, err := gitrelay.ParseHosts(v.GitrelayHosts)
	if err != nil {
		return nil, settings.Invalid("gitrelay-hosts", err)
	}
	return hosts, nil
}

// stackGlobals loads the settings of `nexus up` and `nexus serve` and checks those a service
// parses itself, so that a bad value stops the stack before anything starts.
func stackGlobals(cmd *cobra.Command) (*cli.Global, error) {
	g, err := cli.Globals(cmd)
	if err != nil {
		return nil, err
	}
	if _, err := gitrelayHosts(g.Settings); err != nil {
		return nil, err
	}
	// An unusable home is said as such, before anything reads from it.
	if err := g.Home.Ensure(); err != nil {
		return nil, cli.StartupError(err)
	}
	// A cluster node's services serve the host name it joined under.
	if cl, ok, err := bus.LoadCluster(g.Home); err != nil {
		return nil, err
	} else if ok && g.Settings.Host == bus.LocalHost {
		g.Settings.Host = cl.Host
	}
	failpoint.Arm(g.Home)
	return g, nil
}

// stackFlags declares the stack settings on cmd; --port stays the old name of --bus-port.
func stackFlags(cmd *cobra.Command) {
	settings.AddFlags(cmd.Flags(), settings.Stack)
	cmd.Flags().SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "port" {
			name = "bus-port"
		}
		return pflag.NormalizedName(name)
	})
}

// runner is the entry point every service shares: New(Config) builds it, Run serves until ctx ends.
type runner interface {
	Run(ctx context.Context) error
}

// run builds a service with its New and runs it.
func run[C any, S runner](ctx context.Context, newService func(C) (S, error), cfg C) error {
	s, err := newService(cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// serviceNames is every service, the bus first.
func serviceNames() []string { return bus.Services }

// serveNames is every name `nexus serve` accepts: the services and the HTTP API.
func serveNames() []string { return append(slices.Clone(serviceNames()), apiName) }

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func upCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run the bus and every service in this process (the single-machine default)",
		Long: `Run the bus and every service in this process (the single-machine default), in the
foreground until Ctrl-C, SIGTERM or ` + "`nexus down`" + `.

Sandboxes outlive the stack: stopping it leaves their VMs running, and the next ` + "`nexus up`" + `
re-adopts them (ps, exec, logs work again as before). ` + "`nexus down --all`" + ` stops them too.`,
		Example: `  nexus up &                  # or under a supervisor; nexus status shows the services
  NEXUS_BUS_PORT=4300 nexus up  # a second stack beside the first (with its own NEXUS_HOME)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g, err := stackGlobals(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			srv, err := bus.StartServer(ctx, bus.ServerConfig{Home: g.Home, Port: g.Settings.BusPort, HostName: g.Settings.Host, Log: g.Log})
			if err != nil {
				return cli.StartupError(err)
			}
			defer srv.Shutdown()
			// A cluster node's services open the store as they start: wait for its quorum.
			if err := srv.WaitStore(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return cli.StartupError(err)
			}
			grp, gctx := errgroup.WithContext(ctx)
			names := []string{"bus"}
			users := bus.HostUsers(g.Home)
			for _, c := range components() {
				if !slices.Contains(users, c.name) {
					continue // a worker host of a cluster runs no gateway or credbroker
				}
				nc, err := bus.Connect(ctx, bus.ConnectConfig{Home: g.Home, User: c.name, URL: srv.URL(), Log: g.Log, Reconnect: true})
				if err != nil {
					return cli.StartupError(err)
				}
				defer nc.Close()
				env := runEnv{home: g.Home, host: g.Settings.Host, set: g.Settings, log: g.Log.With().Str("service", c.name).Logger(), nc: nc}
				grp.Go(func() error {
					if err := c.run(gctx, env); err != nil {
						return fmt.Errorf("%s: %w", c.name, err)
					}
					return nil
				})
				names = append(names, c.name)
			}
			if err := registerBus(gctx, srv, g); err != nil {
				return cli.StartupError(err)
			}
			if g.Settings.APIAddr != "" {
				grp.Go(func() error { return runAPI(gctx, g, srv.URL()) })
				names = append(names, apiName)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "nexus %s up: bus %s, services %s (host %s), state in %s\n",
				version.Version, srv.URL(), strings.Join(names, " "), g.Settings.Host, g.Home)
			err = grp.Wait()
			if ctx.Err() != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "nexus: stopping")
				return nil
			}
			return err
		},
	}
	stackFlags(cmd)
	return cmd
}

// registerBus makes the bus itself visible to `nexus status` as a service.
func registerBus(ctx context.Context, srv *bus.Server, g *cli.Global) error {
	nc, err := bus.Connect(ctx, bus.ConnectConfig{Home: g.Home, User: bus.UserBus, URL: srv.URL(), Log: g.Log, Reconnect: true})
	if err != nil {
		return err
	}
	svc, err := bus.NewService(nc, bus.ServiceInfo{Name: "bus", Version: version.Version, Host: g.Settings.Host, Description: "embedded NATS with JetStream"}, g.Log)
	if err != nil {
		nc.Close()
		return err
	}
	go func() {
		<-ctx.Done()
		svc.Stop()
		nc.Close()
	}()
	return nil
}

func serveCommand() *cobra.Command {
	var wait, waitStore time.Duration
	cmd := &cobra.Command{
		Use:       "serve <" + strings.Join(serveNames(), "|") + ">",
		Short:     "Run one service in this process (the Procfile runs one per service)",
		Example:   "  nexus serve bus\n  nexus serve gateway --wait-bus 1m",
		Args:      cobra.ExactArgs(1),
		ValidArgs: serveNames(),
		RunE: func(cmd *cobra.Command, args []string) error {
			g, err := stackGlobals(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			name := args[0]
			if name == "bus" {
				srv, err := bus.StartServer(ctx, bus.ServerConfig{Home: g.Home, Port: g.Settings.BusPort, HostName: g.Settings.Host, Log: g.Log})
				if err != nil {
					return cli.StartupError(err)
				}
				defer srv.Shutdown()
				if err := registerBus(ctx, srv, g); err != nil {
					return cli.StartupError(err)
				}
				g.Log.Info().Str("url", srv.URL()).Msg("bus listening")
				<-ctx.Done()
				return nil
			}
			if name == apiName {
				err := runAPI(ctx, g, "")
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			var c *component
			for _, cc := range components() {
				if cc.name == name {
					c = &cc
				}
			}
			if c == nil {
				return errdefs.Invalid("unknown service %q: use one of %s", name, strings.Join(serveNames(), ", "))
			}
			nc, err := connectWaiting(ctx, g, c.name, wait)
			if err != nil {
				return cli.StartupError(err)
			}
			defer nc.Close()
			log := g.Log.With().Str("service", c.name).Logger()
			// A cluster node's store serves once a quorum of the cluster's nodes is up, which
			// may be long after this service started: wait for what it opens, as `nexus up` does.
			if err := waitClusterStore(ctx, g.Home, nc, c.name, waitStore, log); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return cli.StartupError(err)
			}
			log.Info().Str("url", nc.ConnectedUrl()).Msg("serving")
			err = c.run(ctx, runEnv{home: g.Home, host: g.Settings.Host, set: g.Settings, log: log, nc: nc})
			if ctx.Err() != nil {
				return nil
			}
			return err
		},
	}
	stackFlags(cmd)
	cmd.Flags().DurationVar(&wait, "wait-bus", 30*time.Second, "how long to wait for the bus to come up")
	cmd.Flags().DurationVar(&waitStore, "wait-store", 10*time.Minute, "on a cluster node: how long to wait for a quorum of the cluster's bus nodes to serve the store")
	return cmd
}

// waitClusterStore waits, on a cluster node, up to wait for the store to serve what service
// user opens (bus.WaitStoreAs); on a single host the store serves once the bus answers.
func waitClusterStore(ctx context.Context, h home.Dir, nc *nats.Conn, user string, wait time.Duration, log zerolog.Logger) error {
	if _, ok, err := bus.LoadCluster(h); err != nil || !ok {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := bus.WaitStoreAs(wctx, nc, user, log)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("cluster: the store did not serve within --wait-store %s: is a quorum of the cluster's bus nodes (two of three) up?", wait)
	}
	if err != nil {
		return err
	}
	// On the host that ran `nexus cluster init` its bus migrates the single-host store once
	// the cluster's serves; a gateway started before would find no record of what it holds.
	err = bus.WaitMigrated(wctx, h, log)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("cluster: the bus did not migrate %s within --wait-store %s: see its log", bus.SingleHostStore(h), wait)
	}
	return err
}

// connectWaiting retries until the bus answers: under overmind every process starts at once.
func connectWaiting(ctx context.Context, g *cli.Global, user string, wait time.Duration) (*nats.Conn, error) {
	deadline := time.Now().Add(wait)
	for {
		cfg := g.Bus(user)
		cfg.Reconnect = true
		nc, err := bus.Connect(ctx, cfg)
		if err == nil {
			return nc, nil
		}
		if errors.Is(err, errdefs.ErrRefused) || time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// virtiofsd is the virtiofsd that serves --mount worktrees for mount-fs mode, or empty (9p).
func virtiofsd(mode string) string {
	if mode == "9p" {
		return ""
	}
	if st, err := os.Stat(qemu.DefaultVirtiofsd); err != nil || st.Mode()&0o111 == 0 {
		return ""
	}
	return qemu.DefaultVirtiofsd
}

// jailHelper is this binary, whose hidden subcommand starts QEMU contained; empty when it
// cannot be found (QEMU then starts uncontained, and ps says so).
func jailHelper() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return exe
}
