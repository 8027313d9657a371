package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/rs/zerolog"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Spec, Policy and Info are the wire types of pkg/api/netstack.
type (
	Spec   = netstackapi.Spec
	Policy = netstackapi.Policy
	Info   = netstackapi.Info
)

// Addresses of every sandbox network.
const (
	GatewayIP = "192.168.127.1"
	GuestIP   = "192.168.127.2"
	Subnet    = "192.168.127.0/24"
	// GatewayMAC is locally administered so it never collides with a real NIC.
	GatewayMAC = "02:6e:78:00:00:01"
)

// ManagerConfig configures the Manager.
type ManagerConfig struct {
	Logger zerolog.Logger
	// Audit receives one event per decision. Required.
	Audit audit.Sink
	// MITMAddr is the mitm's loopback TCP address (host:port). The shim sends
	// CONNECT <sni>:<port> there. Empty: after the SNI/Host check the shim dials the resolved IP
	// itself (only until mitm exists).
	MITMAddr string
	// MITMAddrFunc, when set, is asked for the mitm's address on every shimmed connection (the
	// mitm of the same host publishes it in a file and may move after a restart).
	MITMAddrFunc func() (string, error)
	// UpstreamDNS is the resolver (ip:port) allowed names are resolved with; default the first
	// nameserver of /etc/resolv.conf.
	UpstreamDNS string
	// ResolverOverrides maps a host name to "ip[:port]" (like curl --resolve), for tests that
	// stand up fake upstreams on loopback. DNS answers such a name with a synthetic IP from
	// 198.18.0.0/15 and connections to it are dialled to the override. Production leaves it empty.
	ResolverOverrides map[string]string
	// DialTimeout bounds upstream dials (default 10s).
	DialTimeout time.Duration
	// PeekTimeout bounds the wait for a ClientHello or HTTP request head (default 10s).
	PeekTimeout time.Duration
	// DNSGrace is how long after its TTL a DNS answer still admits connections (default 5m).
	DNSGrace time.Duration
	// MTU of the guest link (default 1500).
	MTU int
	// OnRequest is told of each query an ask-mode network holds for approval (ask.go); it must
	// not block.
	OnRequest func(netstackapi.EgressRequest)
	// AskHoldTCP is how long an ask-mode network holds a connection for approval (default
	// AskHoldTCP).
	AskHoldTCP time.Duration
}

// Manager runs the networks of all sandboxes on this host.
type Manager struct {
	cfg       ManagerConfig
	log       zerolog.Logger
	overrides *overrides
	dnsClient *dns.Client

	mu     sync.Mutex
	nets   map[string]*network
	closed bool
}

// NewManager validates cfg and returns a manager with no networks.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.Audit == nil {
		return nil, errors.New("netstack: config: audit sink is required")
	}
	if cfg.AskHoldTCP <= 0 {
		cfg.AskHoldTCP = AskHoldTCP
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = 10 * time.Second
	}
	if cfg.DNSGrace <= 0 {
		cfg.DNSGrace = 5 * time.Minute
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if cfg.MTU < 576 || cfg.MTU > 65520 {
		return nil, fmt.Errorf("netstack: config: mtu %d out of range 576-65520", cfg.MTU)
	}
	if cfg.MITMAddr != "" {
		if _, _, err := net.SplitHostPort(cfg.MITMAddr); err != nil {
			return nil, fmt.Errorf("netstack: config: mitm address %q: %w", cfg.MITMAddr, err)
		}
	}
	if cfg.UpstreamDNS == "" {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil || len(cc.Servers) == 0 {
			return nil, fmt.Errorf("netstack: config: no upstream dns: set UpstreamDNS or a nameserver in /etc/resolv.conf")
		}
		cfg.UpstreamDNS = net.JoinHostPort(cc.Servers[0], cc.Port)
	} else if _, err := netip.ParseAddrPort(cfg.UpstreamDNS); err != nil {
		return nil, fmt.Errorf("netstack: config: upstream dns %q must be ip:port: %w", cfg.UpstreamDNS, err)
	}
	ov, err := newOverrides(cfg.ResolverOverrides)
	if err != nil {
		return nil, fmt.Errorf("netstack: config: %w", err)
	}
	return &Manager{
		cfg:       cfg,
		log:       cfg.Logger.With().Str("service", "netstack").Logger(),
		overrides: ov,
		dnsClient: &dns.Client{Net: "udp", Timeout: 5 * time.Second, UDPSize: 4096},
		nets:      make(map[string]*network),
	}, nil
}

// Run serves until ctx ends, then removes every network.
func (s *Manager) Run(ctx context.Context) error {
	<-ctx.Done()
	s.Close()
	return nil
}

// Close removes every network. The service refuses new networks afterwards.
func (s *Manager) Close() {
	s.mu.Lock()
	s.closed = true
	nets := s.nets
	s.nets = map[string]*network{}
	s.mu.Unlock()
	for _, n := range nets {
		if n != nil { // nil: still being created; CreateNetwork closes it
			n.close()
		}
	}
}

// CreateNetwork starts a sandbox's network: it listens on spec.SocketPath for QEMU and serves the
// guest (re-accepting after a QEMU restart) until RemoveNetwork.
func (s *Manager) CreateNetwork(ctx context.Context, spec Spec) (Info, error) {
	if spec.SandboxID == "" {
		return Info{}, errdefs.Invalid("create network: sandbox id is required")
	}
	if spec.SocketPath == "" {
		return Info{}, errdefs.Invalid("create network %s: socket path is required", spec.SandboxID)
	}
	if len(spec.SocketPath) > 107 {
		return Info{}, errdefs.Invalid("create network %s: socket path is longer than 107 bytes", spec.SandboxID)
	}
	pol, allow, err := normalizePolicy(spec.Policy, time.Now())
	if err == nil {
		err = spec.Limits.Validate()
	}
	if err != nil {
		return Info{}, fmt.Errorf("create network %s: %w", spec.SandboxID, err)
	}
	if err := s.reserve(spec); err != nil {
		return Info{}, err
	}
	n, err := newNetwork(s, spec, pol, allow)
	s.mu.Lock()
	if err != nil {
		delete(s.nets, spec.SandboxID)
		s.mu.Unlock()
		return Info{}, fmt.Errorf("create network %s: %w", spec.SandboxID, err)
	}
	if s.closed {
		s.mu.Unlock()
		n.close()
		return Info{}, errdefs.Unavailable("netstack is shutting down")
	}
	s.nets[spec.SandboxID] = n
	s.mu.Unlock()
	s.log.Info().Str(logSandbox, spec.SandboxID).Str(logMode, pol.Mode).Int("rules", len(pol.Allow)).Msg("network created")
	return n.info(), nil
}

// ReplaceNetwork is CreateNetwork for a sandbox that may have a network already, which it
// replaces: setting a sandbox's perimeter up is idempotent, since each boot sends the whole spec
// (a fresh proxy token among it) and a network left by a failed VM, or by a crash before its
// teardown, must not refuse the next start.
func (s *Manager) ReplaceNetwork(ctx context.Context, spec Spec) (Info, error) {
	if err := s.RemoveNetwork(ctx, spec.SandboxID); err == nil {
		s.log.Info().Str(logSandbox, spec.SandboxID).Msg("network replaced")
	}
	return s.CreateNetwork(ctx, spec)
}

// reserve claims spec's sandbox id (a nil entry while its network starts) after checking that
// neither the id nor the socket is taken.
func (s *Manager) reserve(spec Spec) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errdefs.Unavailable("netstack is shutting down")
	}
	if _, ok := s.nets[spec.SandboxID]; ok {
		return errdefs.Conflict("a network for sandbox %s already exists", spec.SandboxID)
	}
	for _, other := range s.nets {
		if other != nil && other.socketPath == spec.SocketPath { // nil: another create in progress
			return errdefs.Conflict("socket %s is already used by sandbox %s", spec.SocketPath, other.id)
		}
	}
	s.nets[spec.SandboxID] = nil
	return nil
}

// UpdateNetwork replaces a network's policy. Decisions from now on use it, and open connections
// it refuses are closed, each audited with RulePolicyRevoked.
func (s *Manager) UpdateNetwork(ctx context.Context, id string, p Policy) (Info, error) {
	n, err := s.get(id)
	if err != nil {
		return Info{}, fmt.Errorf("update network: %w", err)
	}
	pol, allow, err := normalizePolicy(p, time.Now())
	if err != nil {
		return Info{}, fmt.Errorf("update network %s: %w", id, err)
	}
	cut := n.setPolicy(pol, allow)
	s.log.Info().Str(logSandbox, id).Str(logMode, pol.Mode).Int("rules", len(pol.Allow)).Int("closed", cut).Msg("network updated")
	return n.info(), nil
}

// UpdateLimits replaces a running network's egress budgets.
func (s *Manager) UpdateLimits(id string, l netstackapi.Limits) error {
	n, err := s.get(id)
	if err != nil {
		return fmt.Errorf("update limits: %w", err)
	}
	if err := l.Validate(); err != nil {
		return err
	}
	n.budget.setLimits(l)
	s.log.Info().Str(logSandbox, id).Msg("network limits updated")
	return nil
}

// RemoveNetwork stops a network, closes its guest and upstream connections and its socket.
func (s *Manager) RemoveNetwork(ctx context.Context, id string) error {
	s.mu.Lock()
	n, ok := s.nets[id]
	if !ok || n == nil {
		s.mu.Unlock()
		return fmt.Errorf("remove network: %w", errdefs.NotFound("no network for sandbox %s", id))
	}
	delete(s.nets, id)
	s.mu.Unlock()
	n.close()
	s.log.Info().Str(logSandbox, id).Msg("network removed")
	return nil
}

// Show describes a network: mode, expiry, rules, DNS table and counters.
func (s *Manager) Show(id string) (Info, error) {
	n, err := s.get(id)
	if err != nil {
		return Info{}, fmt.Errorf("show network: %w", err)
	}
	return n.info(), nil
}

// List describes every network, ordered by sandbox id.
func (s *Manager) List() []Info {
	s.mu.Lock()
	nets := make([]*network, 0, len(s.nets))
	for _, n := range s.nets {
		if n != nil {
			nets = append(nets, n)
		}
	}
	s.mu.Unlock()
	out := make([]Info, 0, len(nets))
	for _, n := range nets {
		out = append(out, n.info())
	}
	slices.SortFunc(out, func(a, b Info) int {
		if a.SandboxID < b.SandboxID {
			return -1
		}
		if a.SandboxID > b.SandboxID {
			return 1
		}
		return 0
	})
	return out
}

func (s *Manager) get(id string) (*network, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nets[id]
	if !ok || n == nil {
		return nil, errdefs.NotFound("no network for sandbox %s", id)
	}
	return n, nil
}

// Log field keys.
const (
	logSandbox = "sandbox"
	logMode    = "mode"
)
