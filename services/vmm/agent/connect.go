package agent

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// dialTimeout bounds connect's dial to a guest port and dial-host's wait for the host.
const dialTimeout = 10 * time.Second

// handleConnect dials a guest TCP port on loopback (IPv4, then IPv6) and splices it with the stream.
func (s *Server) handleConnect(ctx context.Context, st *yamux.Stream, port int) {
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		c, err = d.DialContext(ctx, "tcp", net.JoinHostPort("::1", strconv.Itoa(port)))
	}
	if err != nil {
		s.replyErr(st, errdefs.Unavailable("connect: nothing listens on guest port %d", port))
		st.Close()
		return
	}
	s.reply(st, agentproto.Response{})
	agentproto.Splice(st, c)
}

// DialHost opens a stream to host port port over the newest host session: the host connects it
// to its listener for that port (DESIGN §4: vsock.sock_<port>).
func (s *Server) DialHost(port int) (net.Conn, error) {
	s.mu.Lock()
	var sess *yamux.Session
	if n := len(s.sessions); n > 0 {
		sess = s.sessions[n-1]
	}
	s.mu.Unlock()
	if sess == nil {
		return nil, errdefs.Unavailable("dial-host: no host session")
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("dial-host: %w", err)
	}
	st.SetDeadline(time.Now().Add(dialTimeout))
	if err := agentproto.WriteMessage(st, agentproto.Request{Op: agentproto.OpDialHost, Port: port}); err != nil {
		st.Close()
		return nil, fmt.Errorf("dial-host: %w", err)
	}
	if _, err := agentproto.ReadResponse(st); err != nil {
		st.Close()
		return nil, fmt.Errorf("dial-host: port %d: %w", port, err)
	}
	st.SetDeadline(time.Time{})
	return st, nil
}

// ServeHostDial serves guest processes on l (the unix socket agentproto.HostDialSocket): each
// writes "CONNECT <port>\n", gets "OK <port>\n" once the host accepted, then bytes flow to the
// host port. A bad line or a refused port closes the connection without a reply.
func (s *Server) ServeHostDial(ctx context.Context, l net.Listener) error {
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("host dial: %w", err)
		}
		go s.hostDial(c)
	}
}

func (s *Server) hostDial(c net.Conn) {
	c.SetDeadline(time.Now().Add(dialTimeout))
	port, err := agentproto.ReadConnectLine(c)
	if err != nil {
		c.Close()
		return
	}
	st, err := s.DialHost(port)
	if err != nil {
		s.log.Info().Err(err).Int(logPort, port).Msg("dial-host refused")
		c.Close()
		return
	}
	if _, err := c.Write(agentproto.ConnectOK(port)); err != nil {
		c.Close()
		st.Close()
		return
	}
	c.SetDeadline(time.Time{})
	agentproto.Splice(c, st)
}
