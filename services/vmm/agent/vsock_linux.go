package agent

import (
	"context"
	"fmt"

	"github.com/mdlayher/vsock"
)

// ServeVsock serves the protocol on AF_VSOCK port until ctx ends. It fails at once when the
// kernel has no vsock transport; the caller logs that and goes on.
func (s *Server) ServeVsock(ctx context.Context, port uint32) error {
	l, err := vsock.Listen(port, nil)
	if err != nil {
		return fmt.Errorf("vsock: listen on port %d: %w", port, err)
	}
	s.SetVsock(true)
	defer s.SetVsock(false)
	return s.Serve(ctx, l)
}
