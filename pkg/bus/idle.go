package bus

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Serve registers info as a micro service on nc (so status and `nats micro ls` see it), lets
// register add endpoints, and blocks until ctx ends.
func Serve(ctx context.Context, nc *nats.Conn, info ServiceInfo, log zerolog.Logger, register func(*Service) error) error {
	svc, err := NewService(nc, info, log)
	if err != nil {
		return err
	}
	defer svc.Stop()
	if register != nil {
		if err := register(svc); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}
