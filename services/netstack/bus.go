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
	"github.com/IniZio/nexus/pkg/records"
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
	// Resolve maps a host name to "ip[:port]", like curl --resolve (--resolve: a test and
	// offline aid, see ManagerConfig.ResolverOverrides). Production leaves it empty.
	Resolve map[string]string
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
	pub, err := audit.NewSpooledPublisher(cfg.Bus, bus.UserNetstack, cfg.Log, cfg.Home.AuditSpool("netstack"))
	if err != nil {
		return err
	}
	defer pub.Close(context.Background())
	addrFile := filepath.Join(cfg.Home.Run(), mitmapi.AddrFile)
	svc, err := NewManager(ManagerConfig{
		Logger: cfg.Log, Audit: pub, ResolverOverrides: cfg.Resolve,
		UpstreamDNS: cfg.UpstreamDNS,
		OnRequest: func(r netapi.EgressRequest) {
			if b, err := json.Marshal(r); err == nil {
				_ = cfg.Bus.Publish(netapi.RequestSubjectPrefix+"."+r.SandboxID, b)
			}
		},
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
	store, err := records.Open[netapi.Spec](cfg.Home.Networks(), cfg.Log)
	if err != nil {
		return err
	}
	restore(ctx, svc, store, cfg.Log)
	info := bus.ServiceInfo{Name: "netstack", Version: cfg.Version, Host: cfg.Host, Description: "per-sandbox userspace network and L4 allowlist"}
	return bus.Serve(ctx, cfg.Bus, info, cfg.Log, func(s *bus.Service) error {
		for _, err := range []error{
			netapi.Create.Serve(s, func(ctx context.Context, r netapi.CreateRequest) (netapi.Info, error) {
				if err := records.CheckKey(r.SandboxID); err != nil {
					return netapi.Info{}, err
				}
				if r.SocketPath == "" {
					// A gateway on another host cannot name a path here: the socket goes in
					// the sandbox's directory of this host's home, where its vmm boots it.
					r.SocketPath = filepath.Join(cfg.Home.Sandbox(r.SandboxID), "net.sock")
				}
				if err := os.MkdirAll(filepath.Dir(r.SocketPath), 0o700); err != nil {
					return netapi.Info{}, err
				}
				info, err := svc.ReplaceNetwork(ctx, r)
				if err == nil {
					err = store.Put(r.SandboxID, r)
				}
				return info, err
			}),
			netapi.Update.Serve(s, func(ctx context.Context, r netapi.UpdateRequest) (netapi.Info, error) {
				if r.Limits != nil {
					if err := svc.UpdateLimits(r.SandboxID, *r.Limits); err != nil {
						return netapi.Info{}, err
					}
				}
				info, err := svc.UpdateNetwork(ctx, r.SandboxID, r.Policy)
				if err == nil {
					err = store.Update(r.SandboxID, func(spec *netapi.Spec) error {
						spec.Policy = r.Policy
						if r.Limits != nil {
							spec.Limits = *r.Limits
						}
						return nil
					})
				}
				return info, err
			}),
			netapi.Remove.Serve(s, func(ctx context.Context, r netapi.RemoveRequest) (struct{}, error) {
				err := svc.RemoveNetwork(ctx, r.SandboxID)
				if errors.Is(err, errdefs.ErrNotFound) {
					err = nil
				}
				if derr := store.Delete(r.SandboxID); derr != nil {
					cfg.Log.Warn().Err(derr).Str("sandbox", r.SandboxID).Msg("network record not removed")
				}
				return struct{}{}, err
			}),
			netapi.Show.Serve(s, func(ctx context.Context, r netapi.ShowRequest) (netapi.Info, error) {
				return svc.Show(r.SandboxID)
			}),
			netapi.Why.Serve(s, func(ctx context.Context, r netapi.WhyRequest) (netapi.WhyReply, error) {
				return svc.Why(r.SandboxID, r)
			}),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// restore brings back the networks of an earlier run from their records (home.Networks: one
// spec per sandbox, the files of earlier builds included); the guest is attached again as soon
// as the netstack dials QEMU's socket. A record that cannot be read is skipped, logged and
// counted by the store.
func restore(ctx context.Context, svc *Manager, store *records.Store[netapi.Spec], log zerolog.Logger) {
	loaded, err := store.Load()
	if err != nil {
		log.Warn().Err(err).Msg("networks not restored")
		return
	}
	for _, r := range loaded.Records {
		spec := r.Value
		if _, err := svc.CreateNetwork(ctx, spec); err != nil {
			log.Warn().Err(err).Str("sandbox", spec.SandboxID).Msg("network not restored")
			continue
		}
		log.Info().Str("sandbox", spec.SandboxID).Msg("network restored")
	}
	if loaded.Skipped > 0 {
		log.Warn().Int("skipped", loaded.Skipped).Str("dir", store.Dir()).Msg("network records skipped")
	}
}
