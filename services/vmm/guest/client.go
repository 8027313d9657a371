// Package guest is the host side of the guest agent channel (pkg/agentproto): a Client over the
// unix socket QEMU exposes for the agent's virtio-serial port (or any other byte stream), and the
// hybrid-vsock front (ServeHybridVsock) that gives host programs Cloud Hypervisor's
// "CONNECT <port>" semantics on top of it.
//
// The agent is untrusted: every read from it is bounded (agentproto's decoders), every wait has a
// deadline or follows the caller's context, and a misbehaving agent yields an error, not a crash
// or an unbounded allocation.
package guest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Config configures a Client.
type Config struct {
	Logger zerolog.Logger
	// HostDial connects a guest's dial-host stream to a host service; nil refuses them.
	// ServeHybridVsock installs one.
	HostDial func(ctx context.Context, port int) (net.Conn, error)
	// PortOpened, when set, tells Dial the guest has just opened its end of the channel (QEMU's
	// VSERPORT_CHANGE event): the attempt in flight, whose hello was sent into a closed port and
	// lost, is dropped and a new one starts at once instead of waiting out its deadline.
	PortOpened <-chan struct{}
	// PortOpen says the guest's end of the channel is open already: a VM restored from a
	// snapshot or template taken while its agent served a host, or one resumed after a vmm
	// restart. No hello is lost then, so the first attempt already waits openedAttempt: cut
	// short, it throws away the answer a guest just restored (cold code caches, TCG on a loaded
	// host) was about to give, and each retry breaks the session the guest had just started.
	PortOpen bool
}

// Client is one yamux session with a guest agent. It is safe for concurrent use: every call opens
// its own stream.
type Client struct {
	cfg  Config
	log  zerolog.Logger
	sess *yamux.Session
	conn net.Conn
	pong agentproto.Pong

	mu       sync.Mutex
	hostDial func(ctx context.Context, port int) (net.Conn, error)
	local    map[int]func(net.Conn) // host ports served in this process (ServeLocal)

	ctx    context.Context
	cancel context.CancelFunc
}

// Dial connects to the agent behind the unix socket at path (QEMU's chardev socket) and returns
// once the agent answered ping. Until then it retries: the socket may not exist yet, and bytes
// written before the guest opened its port may be lost, so each attempt reconnects and redoes the
// handshake with a growing deadline. It gives up when ctx ends.
func Dial(ctx context.Context, path string) (*Client, error) {
	return DialConfig(ctx, path, Config{Logger: zerolog.Nop()})
}

// DialConfig is Dial with a Config.
func DialConfig(ctx context.Context, path string, cfg Config) (*Client, error) {
	attempt := 250 * time.Millisecond
	var last error
	opened := cfg.PortOpen // the guest's port is open: a hello sent now is heard
	if opened {
		attempt = openedAttempt
	}
	for {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return nil, errdefs.Unavailable("agent: no answer on %s: %v", path, last)
			}
			return nil, fmt.Errorf("agent: %w", err)
		}
		var kicked atomic.Bool
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, attempt)
			if cfg.PortOpened != nil {
				go func() {
					select {
					case <-cfg.PortOpened:
						kicked.Store(true)
						cancel()
					case <-actx.Done():
					}
				}()
			}
			var c *Client
			c, err = NewClient(actx, conn, cfg)
			cancel()
			if err == nil {
				return c, nil
			}
			conn.Close()
			if kicked.Load() {
				// The port is open now: the next hello is heard, and only a slow guest (TCG on a
				// loaded host) keeps its answer waiting, so the next attempts wait for it.
				opened, attempt = true, openedAttempt
				continue
			}
			if !opened {
				// Kept short: while the guest has not opened its port the hello is lost, and
				// the wait for the attempt in flight adds directly to sandbox create time.
				attempt = min(attempt*2, 500*time.Millisecond)
			}
		}
		last = err
		select {
		case <-ctx.Done():
		case <-cfg.PortOpened:
			opened, attempt = true, openedAttempt
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// openedAttempt bounds one handshake once the guest's port is known to be open. Cut short, as
// before the port opened, a guest slowed down by a loaded host never gets its answer in: each
// reconnect throws away the handshake it was answering.
const openedAttempt = 10 * time.Second

// NewClient runs the handshake and a ping on conn (one attempt, bounded by ctx) and returns a
// Client that owns conn.
func NewClient(ctx context.Context, conn net.Conn, cfg Config) (*Client, error) {
	var nb [8]byte
	rand.Read(nb[:])
	nonce := hex.EncodeToString(nb[:])
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Write(agentproto.Hello(nonce)); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	br := bufio.NewReaderSize(conn, 4096)
	if err := agentproto.AwaitReady(br, nonce); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if !stop() {
		return nil, fmt.Errorf("agent: %w", ctx.Err())
	}
	conn.SetDeadline(time.Time{})
	sess, err := yamux.Client(&bufConn{Conn: conn, r: br}, yamuxConfig())
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	c := &Client{cfg: cfg, log: cfg.Logger, sess: sess, conn: conn, hostDial: cfg.HostDial, ctx: cctx, cancel: cancel}
	pong, err := c.Ping(ctx)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.pong = *pong
	go c.acceptLoop()
	return c, nil
}

// yamuxConfig matches the agent's (agent.YamuxConfig; the packages do not import each other).
func yamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false // the caller heartbeats with Ping; a paused guest must not drop the session
	c.MaxStreamWindowSize = 4 << 20
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamCloseTimeout = 30 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.AcceptBacklog = 64
	c.LogOutput = io.Discard
	return c
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Agent returns the Pong the agent answered when the Client connected.
func (c *Client) Agent() agentproto.Pong { return c.pong }

// Close ends the session and the connection.
func (c *Client) Close() error {
	c.cancel()
	err := c.sess.Close()
	c.conn.Close()
	return err
}

// Done is closed when the session ends (agent gone, connection lost or Close).
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// ServeLocal serves the guest's dial-host streams to host port port in this process: serve is
// given each one (and closes it) instead of a connection to a host service.
func (c *Client) ServeLocal(port int, serve func(net.Conn)) {
	c.mu.Lock()
	if c.local == nil {
		c.local = map[int]func(net.Conn){}
	}
	c.local[port] = serve
	c.mu.Unlock()
}

// SetHostDial replaces the handler of guest dial-host streams.
func (c *Client) SetHostDial(fn func(ctx context.Context, port int) (net.Conn, error)) {
	c.mu.Lock()
	c.hostDial = fn
	c.mu.Unlock()
}

var longAgo = time.Unix(1, 0)

// open starts a stream for req and reads the Response. The stream follows ctx: when ctx ends,
// every pending read and write on it fails. release stops that watch (call it when done).
func (c *Client) open(ctx context.Context, req agentproto.Request) (st *yamux.Stream, resp *agentproto.Response, release func(), err error) {
	st, err = c.sess.OpenStream()
	if err != nil {
		return nil, nil, nil, errdefs.Unavailable("agent: %s: %v", req.Op, err)
	}
	// The watch holds the stream itself: st is a result the failure paths set to nil, maybe
	// while the watch, started by a ctx that ended meanwhile, still runs.
	watched := st
	stop := context.AfterFunc(ctx, func() { watched.SetDeadline(longAgo) })
	release = func() { stop() }
	fail := func(err error) (*yamux.Stream, *agentproto.Response, func(), error) {
		stop()
		st.Close()
		if ctx.Err() != nil {
			return nil, nil, nil, fmt.Errorf("agent: %s: %w", req.Op, ctx.Err())
		}
		return nil, nil, nil, err
	}
	if err := agentproto.WriteMessage(st, req); err != nil {
		return fail(fmt.Errorf("agent: %s: %w", req.Op, err))
	}
	resp, err = agentproto.ReadResponse(st)
	if err != nil {
		if resp != nil { // the agent refused: keep its classified error as is
			return fail(err)
		}
		return fail(fmt.Errorf("agent: %s: %w", req.Op, err))
	}
	return st, resp, release, nil
}

// call runs a request with no payload after the Response.
func (c *Client) call(ctx context.Context, req agentproto.Request) (*agentproto.Response, error) {
	st, resp, release, err := c.open(ctx, req)
	if err != nil {
		return nil, err
	}
	release()
	st.Close()
	return resp, nil
}

// Ping checks the agent answers; use it as the heartbeat (with a deadline in ctx).
func (c *Client) Ping(ctx context.Context) (*agentproto.Pong, error) {
	resp, err := c.call(ctx, agentproto.Request{Op: agentproto.OpPing})
	if err != nil {
		return nil, err
	}
	if resp.Pong == nil {
		return nil, errors.New("agent: ping: answer without pong")
	}
	return resp.Pong, nil
}

// Configure sets hostname, exec environment, clock and network in the guest.
func (c *Client) Configure(ctx context.Context, req agentproto.ConfigureRequest) error {
	_, err := c.call(ctx, agentproto.Request{Op: agentproto.OpConfigure, Configure: &req})
	return err
}

// Listeners lists the TCP sockets listening in the guest.
func (c *Client) Listeners(ctx context.Context) ([]agentproto.Listener, error) {
	resp, err := c.call(ctx, agentproto.Request{Op: agentproto.OpListeners})
	if err != nil {
		return nil, err
	}
	return resp.Listeners, nil
}

// WatchListeners hands fn the guest's listening TCP sockets, the set now and each set the agent
// pushes after it, until ctx ends or the stream fails; the error says which. It reads the next
// set no sooner than gap after the last: however fast a guest pushes, the host decodes and
// hands on at most one set per gap (the yamux window holds the guest back meanwhile). An agent
// that predates the op refuses it with an errdefs.ErrInvalid error before fn is called.
func (c *Client) WatchListeners(ctx context.Context, gap time.Duration, fn func([]agentproto.Listener)) error {
	op := agentproto.OpWatchListeners
	st, resp, release, err := c.open(ctx, agentproto.Request{Op: op})
	if err != nil {
		return err
	}
	defer release()
	defer st.Close()
	for {
		fn(resp.Listeners)
		if gap > 0 {
			t := time.NewTimer(gap)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		if resp, err = agentproto.ReadResponse(st); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("agent: %s: %w", op, ctx.Err())
			}
			if resp != nil { // the agent's own error, classified
				return err
			}
			return fmt.Errorf("agent: %s: %w", op, err)
		}
	}
}

// Shutdown asks the agent to sync, unmount and power off; QEMU exits soon after it returns.
func (c *Client) Shutdown(ctx context.Context) error {
	_, err := c.call(ctx, agentproto.Request{Op: agentproto.OpShutdown})
	return err
}

// MaxLogs bounds what Logs accepts from the agent (its ring is 1 MiB).
const MaxLogs = 2 << 20

// Logs returns the agent's own log ring.
func (c *Client) Logs(ctx context.Context) ([]byte, error) {
	st, _, release, err := c.open(ctx, agentproto.Request{Op: agentproto.OpLogs})
	if err != nil {
		return nil, err
	}
	defer release()
	defer st.Close()
	var out []byte
	err = readData(bufio.NewReader(st), func(p []byte) error {
		if len(out)+len(p) > MaxLogs {
			return fmt.Errorf("agent: logs: more than %d bytes", MaxLogs)
		}
		out = append(out, p...)
		return nil
	})
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	return out, nil
}

// readData reads Data frames until End, handing each payload to fn.
func readData(r io.Reader, fn func([]byte) error) error {
	buf := make([]byte, agentproto.MaxFramePayload)
	for {
		t, p, err := agentproto.ReadFrame(r, buf)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		switch t {
		case agentproto.FrameData:
			if err := fn(p); err != nil {
				return err
			}
		case agentproto.FrameEnd:
			return nil
		case agentproto.FrameError:
			return errors.New(string(p))
		default:
			return fmt.Errorf("unexpected %s frame from the agent", t)
		}
	}
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// maxHostDials bounds concurrent dial-host streams a guest may hold open.
const maxHostDials = 256

// acceptLoop serves streams the agent opens (dial-host only).
func (c *Client) acceptLoop() {
	sem := make(chan struct{}, maxHostDials)
	for {
		st, err := c.sess.AcceptStream()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			st.Close() // too many: refuse without reading
			continue
		}
		go func() {
			defer func() { <-sem }()
			c.serveHostDial(st)
		}()
	}
}

func (c *Client) serveHostDial(st *yamux.Stream) {
	st.SetDeadline(time.Now().Add(10 * time.Second))
	req, err := agentproto.ReadRequest(st)
	if err != nil || req.Op != agentproto.OpDialHost {
		if err == nil {
			err = errdefs.Invalid("%s: not served by the host", req.Op)
		}
		c.log.Warn().Err(err).Msg("agent stream refused")
		agentproto.WriteMessage(st, agentproto.ErrorResponse(err))
		st.Close()
		return
	}
	c.mu.Lock()
	dial, local := c.hostDial, c.local[req.Port]
	c.mu.Unlock()
	if local != nil {
		dial = func(context.Context, int) (net.Conn, error) {
			here, there := net.Pipe()
			go local(there)
			return here, nil
		}
	}
	if dial == nil {
		agentproto.WriteMessage(st, agentproto.ErrorResponse(errdefs.Refused("dial-host: host port %d is not exposed", req.Port)))
		st.Close()
		return
	}
	dctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	conn, err := dial(dctx, req.Port)
	cancel()
	if err != nil {
		c.log.Info().Err(err).Int("port", req.Port).Msg("dial-host failed")
		agentproto.WriteMessage(st, agentproto.ErrorResponse(errdefs.Unavailable("dial-host: host port %d: nothing listens", req.Port)))
		st.Close()
		return
	}
	if err := agentproto.WriteMessage(st, agentproto.Response{}); err != nil {
		conn.Close()
		st.Close()
		return
	}
	st.SetDeadline(time.Time{})
	agentproto.Splice(st, conn)
}
