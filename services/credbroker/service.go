package credbroker

import (
	"context"
	"os"
	"path/filepath"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

// Config configures the credbroker service on the bus.
type Config struct {
	Bus     *nats.Conn
	Home    home.Dir
	Host    string
	Log     zerolog.Logger
	Version string
	// ClaudeCredentials is the host's ~/.claude/.credentials.json, guarded while a claude-code
	// sandbox runs; TokenURL overrides the OAuth endpoint (tests).
	ClaudeCredentials string
	TokenURL          string
}

// Service serves the broker on nexus.cred.*.
type Service struct {
	cfg    Config
	broker *Broker

	mu       sync.Mutex
	armed    map[string]bool // sandboxes that live-mount the Claude credentials
	guardian context.CancelFunc
}

// New opens the secret store under $NEXUS_HOME/secrets.
func New(cfg Config) (*Service, error) {
	b, err := newBroker(brokerConfig{Dir: cfg.Home.Secrets(), Logger: cfg.Log})
	if err != nil {
		return nil, err
	}
	if cfg.ClaudeCredentials == "" {
		if h, err := os.UserHomeDir(); err == nil {
			cfg.ClaudeCredentials = filepath.Join(h, ".claude", ".credentials.json")
		}
	}
	return &Service{cfg: cfg, broker: b, armed: map[string]bool{}}, nil
}

// Run registers the endpoints and serves until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	defer s.disarmAll()
	info := bus.ServiceInfo{Name: "credbroker", Version: s.cfg.Version, Host: s.cfg.Host, Description: "secrets, placeholders, credential guardian"}
	// One credbroker serves a bus (a cluster's included): the store and the placeholders it
	// minted are in this host's home. Another one stands by until this one is gone.
	return bus.ServeSole(ctx, s.cfg.Bus, info, s.cfg.Log, func(svc *bus.Service) error {
		for _, err := range []error{
			credapi.Resolve.Serve(svc, func(ctx context.Context, r credapi.ResolveRequest) (credapi.ResolveResponse, error) {
				v, err := s.broker.Resolve(ctx, r.SandboxID, r.Host, r.Placeholder)
				return credapi.ResolveResponse{Value: v}, err
			}),
			credapi.Mint.Serve(svc, func(ctx context.Context, r credapi.MintRequest) (credapi.MintResponse, error) {
				return s.broker.Mint(r)
			}),
			credapi.Forget.Serve(svc, func(ctx context.Context, r credapi.ForgetRequest) (struct{}, error) {
				s.disarm(r.SandboxID)
				return struct{}{}, s.broker.Forget(r.SandboxID)
			}),
			credapi.SecretSet.Serve(svc, func(ctx context.Context, r credapi.SecretSetRequest) (struct{}, error) {
				return struct{}{}, s.broker.Set(r)
			}),
			credapi.SecretList.Serve(svc, func(ctx context.Context, _ struct{}) (credapi.SecretListResponse, error) {
				list, err := s.broker.List()
				return credapi.SecretListResponse{Secrets: list}, err
			}),
			credapi.SecretRemove.Serve(svc, func(ctx context.Context, r credapi.SecretRemoveRequest) (struct{}, error) {
				return struct{}{}, s.broker.Remove(r.Name)
			}),
			credapi.Guard.Serve(svc, func(ctx context.Context, r credapi.GuardRequest) (struct{}, error) {
				s.arm(r.SandboxID)
				return struct{}{}, nil
			}),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// arm starts the Claude credential guardian while at least one sandbox live-mounts the file.
func (s *Service) arm(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed[id] = true
	if s.guardian != nil || s.cfg.ClaudeCredentials == "" {
		return
	}
	g, err := NewGuardian(GuardianConfig{CredentialsPath: s.cfg.ClaudeCredentials, TokenURL: s.cfg.TokenURL, Logger: s.cfg.Log})
	if err != nil {
		s.cfg.Log.Warn().Err(err).Msg("credential guardian not armed")
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.guardian = cancel
	go g.Run(ctx)
}

func (s *Service) disarm(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.armed, id)
	if len(s.armed) == 0 && s.guardian != nil {
		s.guardian()
		s.guardian = nil
	}
}

func (s *Service) disarmAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.guardian != nil {
		s.guardian()
		s.guardian = nil
	}
}
