package mitm

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/pkg/records"
)

// Config configures the mitm service on the bus.
type Config struct {
	Bus     *nats.Conn
	Home    home.Dir
	Host    string
	Log     zerolog.Logger
	Version string
	// Addr is where CONNECTs are accepted; default the address used last time, else a free
	// loopback port. It is written to $NEXUS_HOME/run/mitm.addr for the netstack.
	Addr string
	// Resolve maps a host name (or "host:port") to the address dialled instead, like curl
	// --resolve; ExtraRoots are trusted for upstream TLS besides the system roots. Both are test
	// and offline aids (--resolve, --extra-ca); production leaves them empty.
	Resolve    map[string]string
	ExtraRoots []*x509.Certificate
}

// Service runs the proxy and keeps its sandbox policies, which survive a restart: they are
// records (hashes only, never a secret) in Home.MITMSandboxes(), one <sandbox id>.json each, as
// every earlier build wrote them.
type Service struct {
	cfg     Config
	reg     *Registry
	records *records.Store[mitmapi.SandboxPolicy]
}

// New prepares the service; Run starts it.
func New(cfg Config) (*Service, error) {
	return &Service{cfg: cfg, reg: NewRegistry()}, nil
}

// Run listens, loads the stored policies, registers the endpoints and serves until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if err := s.restore(); err != nil {
		return err
	}
	pub, err := audit.NewSpooledPublisher(s.cfg.Bus, bus.UserMITM, s.cfg.Log, s.cfg.Home.AuditSpool("mitm"))
	if err != nil {
		return err
	}
	defer pub.Close(context.Background())
	proxy, err := newProxy(proxyConfig{
		CADir: s.cfg.Home.CA(), Sandboxes: s.reg, Resolver: ResolverFunc(s.resolve), Audit: pub, Logger: s.cfg.Log,
		ExtraRootCAs: s.cfg.ExtraRoots, ResolverOverrides: s.cfg.Resolve,
	})
	if err != nil {
		return err
	}
	defer proxy.Close()
	ln, err := s.listen()
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	go proxy.Serve(ln)
	info := bus.ServiceInfo{Name: "mitm", Version: s.cfg.Version, Host: s.cfg.Host, Description: "TLS MITM: SNI/Host allowlist and credential swap"}
	return bus.Serve(ctx, s.cfg.Bus, info, s.cfg.Log, func(svc *bus.Service) error {
		for _, err := range []error{
			mitmapi.Register.Serve(svc, func(ctx context.Context, r mitmapi.RegisterRequest) (mitmapi.RegisterResponse, error) {
				return mitmapi.RegisterResponse{Addr: addr}, s.register(r.Policy)
			}),
			mitmapi.Forget.Serve(svc, func(ctx context.Context, r mitmapi.ForgetRequest) (struct{}, error) {
				s.forget(r.ID)
				return struct{}{}, nil
			}),
			mitmapi.SetHosts.Serve(svc, func(ctx context.Context, r mitmapi.SetHostsRequest) (struct{}, error) {
				return struct{}{}, s.setHosts(r)
			}),
			mitmapi.CACert.Serve(svc, func(ctx context.Context, _ struct{}) (mitmapi.CACertResponse, error) {
				return mitmapi.CACertResponse{PEM: string(proxy.CACertPEM())}, nil
			}),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// listen binds the configured address, or the one used before (so a restarted mitm is found
// where the netstack expects it), or a free port; and records it. It listens on loopback only:
// the netstack of the same host is its one client. (A fresh home has no address file: an
// earlier build then listened on ":0", every interface, besides the loopback port it used.)
func (s *Service) listen() (net.Listener, error) {
	addrFile := filepath.Join(s.cfg.Home.Run(), mitmapi.AddrFile)
	addr := s.cfg.Addr
	if addr != "" && !loopbackAddr(addr) {
		return nil, errdefs.Invalid("mitm: cannot listen on %s: the mitm listens on 127.0.0.1 only", addr)
	}
	if addr == "" {
		if b, err := os.ReadFile(addrFile); err == nil && loopbackAddr(strings.TrimSpace(string(b))) {
			addr = strings.TrimSpace(string(b))
		}
	}
	var ln net.Listener
	var err error
	if addr != "" {
		ln, err = net.Listen("tcp", addr)
	}
	if ln == nil {
		if s.cfg.Addr != "" {
			return nil, errdefs.Unavailable("mitm: cannot listen on %s: %v", s.cfg.Addr, err)
		}
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, err
		}
	}
	os.MkdirAll(s.cfg.Home.Run(), 0o700)
	tmp := addrFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(ln.Addr().String()+"\n"), 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, os.Rename(tmp, addrFile)
}

// sandboxOf compiles a sandbox's policy as registered (or stored) into what the proxy knows.
func sandboxOf(p mitmapi.SandboxPolicy) (*Sandbox, error) {
	hp, err := requestPolicy(p)
	if err != nil {
		return nil, err
	}
	return NewSandbox(p, hp)
}

func (s *Service) register(p mitmapi.SandboxPolicy) error {
	if strings.ContainsAny(p.ID, "/\\.") || p.ID == "" {
		return errdefs.Invalid("mitm: bad sandbox id %q", p.ID)
	}
	sb, err := sandboxOf(p)
	if err != nil {
		return err
	}
	if err := s.records.Put(p.ID, p); err != nil {
		return err
	}
	s.reg.Put(sb)
	return nil
}

// setHosts replaces a registered sandbox's hosts; the stored policy and the served one change
// together, and a sandbox the mitm does not know is not found.
func (s *Service) setHosts(r mitmapi.SetHostsRequest) error {
	p, err := s.records.Get(r.ID)
	if err != nil {
		return err
	}
	p.AllowedHosts, p.DeniedHosts, p.Requests, p.AllowPrivate = r.AllowedHosts, r.DeniedHosts, r.Requests, r.AllowPrivate
	return s.register(p)
}

func (s *Service) forget(id string) {
	s.reg.Forget(id)
	if err := s.records.Delete(id); err != nil && !errors.Is(err, errdefs.ErrInvalid) {
		s.cfg.Log.Warn().Err(err).Str(logKeySandbox, id).Msg("sandbox record not removed")
	}
}

// restore opens the sandbox records and registers every sandbox an earlier run stored. A
// record that does not load or compile is skipped (logged and counted); the others are served.
func (s *Service) restore() error {
	st, err := records.Open[mitmapi.SandboxPolicy](s.cfg.Home.MITMSandboxes(), s.cfg.Log)
	if err != nil {
		return err
	}
	s.records = st
	loaded, err := st.Load()
	if err != nil {
		return err
	}
	restored, skipped := 0, loaded.Skipped
	for _, r := range loaded.Records {
		sb, err := sandboxOf(r.Value)
		if err != nil {
			skipped++
			s.cfg.Log.Warn().Err(err).Str(logKeySandbox, r.Key).Msg("stored sandbox policy skipped")
			continue
		}
		s.reg.Put(sb)
		restored++
	}
	s.cfg.Log.Info().Int("restored", restored).Int("skipped", skipped).Msg("sandbox policies loaded")
	return nil
}

// resolve asks credbroker for the real value behind a placeholder.
func (s *Service) resolve(ctx context.Context, sandboxID, host, placeholder string) (string, error) {
	resp, err := credapi.NewClient(s.cfg.Bus).Resolve(ctx, credapi.ResolveRequest{SandboxID: sandboxID, Host: host, Placeholder: placeholder})
	if err != nil {
		if errors.Is(err, errdefs.ErrRefused) || errors.Is(err, errdefs.ErrNotFound) {
			return "", err
		}
		return "", fmt.Errorf("credbroker: %w", err)
	}
	return resp.Value, nil
}

// loopbackAddr reports whether addr is ip:port with a loopback ip.
func loopbackAddr(addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	return err == nil && ap.Addr().IsLoopback()
}
