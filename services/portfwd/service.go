// Package portfwd makes a guest listener appear at the same port on 127.0.0.1 of the host.
package portfwd

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/bus"
)

// Config configures the forwarder.
type Config struct {
	Bus     *nats.Conn
	Host    string
	Log     zerolog.Logger
	Version string
}

// Service is the port-forward service.
type Service struct{ cfg Config }

// New returns the port-forward service.
func New(cfg Config) *Service { return &Service{cfg: cfg} }

// Run registers the service on the bus and serves until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return bus.Serve(ctx, s.cfg.Bus, bus.ServiceInfo{Name: "portfwd", Version: s.cfg.Version, Host: s.cfg.Host,
		Description: "guest listeners at the same port on the host"}, s.cfg.Log, nil)
}
