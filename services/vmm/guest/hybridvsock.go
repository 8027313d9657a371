package guest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// connectLineTimeout bounds how long a host client may take to send its CONNECT line.
const connectLineTimeout = 10 * time.Second

func errInvalidPort(port int) error { return errdefs.Invalid("port %d out of range", port) }

// HostDialPath is where a guest connection to host port lands: "<dir>/<base of sockPath>_<port>",
// i.e. "<sockPath>_<port>" when dir is the socket's own directory (Cloud Hypervisor's layout).
func HostDialPath(sockPath, hostDialDir string, port int) string {
	if hostDialDir == "" {
		hostDialDir = filepath.Dir(sockPath)
	}
	return filepath.Join(hostDialDir, filepath.Base(sockPath)) + "_" + strconv.Itoa(port)
}

// ServeHybridVsock gives c Cloud Hypervisor's hybrid-vsock semantics (DESIGN §4) until ctx ends:
//   - host → guest: it listens on sockPath; a client writes "CONNECT <port>\n", gets "OK <port>\n"
//     and is spliced to guest TCP port <port>. A malformed line, a slow line or a port nothing
//     listens on closes the connection without a reply.
//   - guest → host: a guest dial-host stream for port N is connected to the unix socket
//     HostDialPath(sockPath, hostDialDir, N) (that is "<sockPath>_N" when hostDialDir is "").
//
// The socket file is removed when ServeHybridVsock returns.
func ServeHybridVsock(ctx context.Context, c *Client, sockPath, hostDialDir string) error {
	c.SetHostDial(func(ctx context.Context, port int) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", HostDialPath(sockPath, hostDialDir, port))
	})
	if err := os.Remove(sockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("hybrid vsock: %w", err)
	}
	l, err := net.Listen("unix", sockPath)
	if err != nil {
		return fmt.Errorf("hybrid vsock: %w", err)
	}
	if err := os.Chmod(sockPath, 0o600); err != nil { // the guest's agent: for this user only
		l.Close()
		return fmt.Errorf("hybrid vsock: %w", err)
	}
	defer os.Remove(sockPath)
	go func() {
		select {
		case <-ctx.Done():
		case <-c.Done():
		}
		l.Close()
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			select {
			case <-c.Done():
				return errdefs.Unavailable("hybrid vsock: agent session ended")
			default:
			}
			return fmt.Errorf("hybrid vsock: %w", err)
		}
		go serveConnect(ctx, c, conn)
	}
}

func serveConnect(ctx context.Context, c *Client, conn net.Conn) {
	conn.SetDeadline(time.Now().Add(connectLineTimeout))
	port, err := agentproto.ReadConnectLine(conn)
	if err != nil {
		conn.Close()
		return
	}
	dctx, cancel := context.WithTimeout(ctx, connectLineTimeout)
	st, err := c.Connect(dctx, port)
	cancel()
	if err != nil {
		c.log.Debug().Err(err).Int("port", port).Msg("hybrid vsock connect failed")
		conn.Close()
		return
	}
	if _, err := conn.Write(agentproto.ConnectOK(port)); err != nil {
		conn.Close()
		st.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	agentproto.Splice(conn, st)
}
