package guest

import (
	"context"
	"net"

	"github.com/hashicorp/yamux"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// Connect opens a byte stream to TCP port on the guest's loopback (127.0.0.1, then ::1). ctx
// bounds only the set-up. The conn supports CloseWrite (half-close).
func (c *Client) Connect(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errInvalidPort(port)
	}
	st, _, release, err := c.open(ctx, agentproto.Request{Op: agentproto.OpConnect, Port: port})
	if err != nil {
		return nil, err
	}
	release()
	return &streamConn{st}, nil
}

// streamConn is a yamux stream as a net.Conn with CloseWrite. A yamux Close sends FIN and keeps
// the stream readable until the peer closes too, which is exactly a half-close; Close also stops
// pending reads so it behaves like closing a socket.
type streamConn struct{ *yamux.Stream }

func (c *streamConn) CloseWrite() error { return c.Stream.Close() }

func (c *streamConn) Close() error {
	err := c.Stream.Close()
	c.Stream.SetReadDeadline(longAgo)
	return err
}
