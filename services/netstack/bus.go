package netstack

import (
	"context"
	"encoding/json"
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

// Config configures the netstack service on the bus.
type Config struct {
	Bus     *nats.Conn
	Home    home.Dir
	Host    string
	Log     zerolog.Logger
	Version string
	// UpstreamDNS is the resolver (ip:port) allowed names are resolved with; default the first
	// nameserver of /etc/resolv.conf.
	UpstreamDNS string
}

// Service runs the netstack on the bus: audit events go to JetStream, shimmed connections to
// the mitm of this host (whose address it publishes under $NEXUS_HOME/run).
type Service struct {
	cfg Config
}

// New returns the service; Run builds the networks and serves.
func New(cfg Config) (*Service, error) {
	return &Service{cfg: cfg}, nil
}

// Run restores the networks of an earlier run, registers the endpoints and serves until ctx
// ends; then it removes every network.
func (s *Service) Run(ctx context.Context) error {
	cfg := s.cfg
	pub, err := audit.NewSpooledPublisher(cfg.Bus, cfg.Log, cfg.Home.AuditSpool("netstack"))
	if err != nil {
		return err
	}
	defer pub.Close(context.Background())
	overrides, err := testknobs.Resolve()
	if err != nil {
		return errdefs.Invalid("%v", err)
	}
	addrFile := filepath.Join(cfg.Home.Run(), mitmapi.AddrFile)
	svc, err := NewManager(ManagerConfig{
		Logger: cfg.Log, Audit: pub, ResolverOverrides: overrides,
		UpstreamDNS: cfg.UpstreamDNS,
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
	store := specStore(filepath.Join(string(cfg.Home), "netstack"))
	store.restore(ctx, svc, cfg.Log)
	info := bus.ServiceInfo{Name: "netstack", Version: cfg.Version, Host: cfg.Host, Description: "per-sandbox userspace network and L4 allowlist"}
	return bus.Serve(ctx, cfg.Bus, info, cfg.Log, func(s *bus.Service) error {
		for _, err := range []error{
			netapi.Create.Serve(s, func(ctx context.Context, r netapi.CreateRequest) (netapi.Info, error) {
				if err := os.MkdirAll(filepath.Dir(r.SocketPath), 0o700); err != nil {
					return netapi.Info{}, err
				}
				info, err := svc.CreateNetwork(ctx, r)
				if err == nil {
					err = store.save(r)
				}
				return info, err
			}),
			netapi.Update.Serve(s, func(ctx context.Context, r netapi.UpdateRequest) (netapi.Info, error) {
				info, err := svc.UpdateNetwork(ctx, r.SandboxID, r.Policy)
				if err == nil {
					err = store.update(r.SandboxID, r.Policy)
				}
				return info, err
			}),
			netapi.Remove.Serve(s, func(ctx context.Context, r netapi.RemoveRequest) (struct{}, error) {
				err := svc.RemoveNetwork(ctx, r.SandboxID)
				if errors.Is(err, errdefs.ErrNotFound) {
					err = nil
				}
				store.remove(r.SandboxID)
				return struct{}{}, err
			}),
			netapi.Show.Serve(s, func(ctx context.Context, r netapi.ShowRequest) (netapi.Info, error) {
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

// specStore keeps each network's spec (0600: it holds the sandbox's proxy token) so that a
// restarted netstack brings every network back; the guest is attached again as soon as the
// netstack dials QEMU's socket.
type specStore string

func (d specStore) path(id string) string { return filepath.Join(string(d), id+".json") }

func (d specStore) save(spec netapi.Spec) error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	tmp := d.path(spec.SandboxID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, d.path(spec.SandboxID))
}

func (d specStore) update(id string, p netapi.Policy) error {
	b, err := os.ReadFile(d.path(id))
	if err != nil {
		return err
	}
	var spec netapi.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return err
	}
	spec.Policy = p
	return d.save(spec)
}

func (d specStore) remove(id string) { os.Remove(d.path(id)) }

func (d specStore) restore(ctx context.Context, svc *Manager, log zerolog.Logger) {
	files, _ := filepath.Glob(filepath.Join(string(d), "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var spec netapi.Spec
		if json.Unmarshal(b, &spec) != nil {
			continue
		}
		if _, err := svc.CreateNetwork(ctx, spec); err != nil {
			log.Warn().Err(err).Str("sandbox", spec.SandboxID).Msg("network not restored")
			continue
		}
		log.Info().Str("sandbox", spec.SandboxID).Msg("network restored")
	}
}
