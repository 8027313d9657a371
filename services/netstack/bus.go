package netstack

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/pkg/testknobs"
)

// BusConfig configures the netstack service on the bus.
type BusConfig struct {
	Bus     *nats.Conn
	Home    home.Dir
	Host    string
	Log     zerolog.Logger
	Version string
}

// Serve runs the netstack on the bus: audit events go to JetStream, shimmed connections to
// the mitm of this host (whose address it publishes under $NEXUS_HOME/run).
func Serve(ctx context.Context, cfg BusConfig) error {
	pub, err := audit.NewPublisher(cfg.Bus, cfg.Log)
	if err != nil {
		return err
	}
	defer pub.Close(context.Background())
	overrides, err := testknobs.Resolve()
	if err != nil {
		return errdefs.Invalid("%v", err)
	}
	addrFile := filepath.Join(cfg.Home.Run(), mitmapi.AddrFile)
	svc, err := New(Config{
		Logger: cfg.Log, Audit: pub, ResolverOverrides: overrides,
		UpstreamDNS: os.Getenv("NEXUS_UPSTREAM_DNS"),
		MITMAddrFunc: func() (string, error) {
			b, err := os.ReadFile(addrFile)
			if err != nil {
				return "", errors.New("the mitm service has not published its address")
			}
			return strings.TrimSpace(string(b)), nil
		},
	})
	if err != nil {
		return err
	}
	defer svc.Close()
	info := bus.ServiceInfo{Name: "netstack", Version: cfg.Version, Host: cfg.Host, Description: "per-sandbox userspace network and L4 allowlist"}
	return bus.Serve(ctx, cfg.Bus, info, cfg.Log, func(s *bus.Service) error {
		sub := func(verb string) string { return netapi.Subject(cfg.Host, verb) }
		for _, err := range []error{
			bus.Handle(s, "create", sub(netapi.VerbCreate), func(ctx context.Context, r netapi.CreateRequest) (netapi.Info, error) {
				if err := os.MkdirAll(filepath.Dir(r.SocketPath), 0o700); err != nil {
					return netapi.Info{}, err
				}
				return svc.CreateNetwork(ctx, r)
			}),
			bus.Handle(s, "update", sub(netapi.VerbUpdate), func(ctx context.Context, r netapi.UpdateRequest) (netapi.Info, error) {
				return svc.UpdateNetwork(ctx, r.SandboxID, r.Policy)
			}),
			bus.Handle(s, "remove", sub(netapi.VerbRemove), func(ctx context.Context, r netapi.RemoveRequest) (struct{}, error) {
				err := svc.RemoveNetwork(ctx, r.SandboxID)
				if errors.Is(err, errdefs.ErrNotFound) {
					err = nil
				}
				return struct{}{}, err
			}),
			bus.Handle(s, "show", sub(netapi.VerbShow), func(ctx context.Context, r netapi.ShowRequest) (netapi.Info, error) {
				return svc.Show(r.SandboxID)
			}),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
}
