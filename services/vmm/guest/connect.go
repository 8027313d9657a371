package guest

import (
	"context"
	"net"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// Connect opens a byte stream to TCP port on the guest's loopback (127.0.0.1, then ::1). ctx
// bounds only the set-up. Close on the returned conn half-closes first (a yamux FIN): the stream
// is gone once the guest side closes too.
func (c *Client) Connect(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errInvalidPort(port)
	}
	st, _, release, err := c.open(ctx, agentproto.Request{Op: agentproto.OpConnect, Port: port})
	if err != nil {
		return nil, err
	}
	release()
	return st, nil
}
