// Package gitrelay is the git-over-SSH relay: it checks the repo and branch policy of each
// git-upload-pack / git-receive-pack a guest asks for, then runs the host's ssh.
package gitrelay

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/bus"
)

// Config configures the relay.
type Config struct {
	Bus     *nats.Conn
	Host    string
	Log     zerolog.Logger
	Version string
}

// Service is the relay service.
type Service struct{ cfg Config }

// New returns the relay service.
func New(cfg Config) *Service { return &Service{cfg: cfg} }

// Run registers the service on the bus and serves until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return bus.Serve(ctx, s.cfg.Bus, bus.ServiceInfo{Name: "gitrelay", Version: s.cfg.Version, Host: s.cfg.Host,
		Description: "git over SSH relay with repo and branch policy"}, s.cfg.Log, nil)
}
