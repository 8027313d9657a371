// Package agent is nexus-agent, the guest side of the host↔guest channel (DESIGN §4): it boots
// the guest as PID 1 (modules, root switch, clock, network; boot_linux.go) and serves the
// agentproto protocol (exec, file copy, connect, dial-host, listeners, logs, shutdown).
//
// The serving half is a plain library: Server.Serve and Server.ServeConn run on any host in
// tests over unix sockets, with the PID 1 pieces (reaper, clock, hostname, network, power-off)
// injected through Config.
package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Log field keys.
const (
	logOp     = "op"
	logPort   = "port"
	logPath   = "path"
	logArgv0  = "argv0"
	logRemote = "remote"
)

// DefaultPath is the PATH of every exec unless the base env, configure or the request sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:" + agentproto.GuestBinDir

// requestTimeout bounds how long a stream may take to send its Request.
const requestTimeout = 30 * time.Second

// Config configures a Server. Zero hooks mean "not the guest init": the op is accepted but only
// recorded (hostname), ignored (time) or refused (network, shutdown).
type Config struct {
	Logger zerolog.Logger
	// Env is the base environment of every exec; configure's env and the request's env override it.
	Env []string
	// Dir is the working directory when a request names none; "/" when empty.
	Dir string
	// ProcRoot is where /proc is mounted ("/proc" when empty); tests point it elsewhere.
	ProcRoot string
	// Logs is the agent's own log ring, served by the logs op (empty when nil).
	Logs *Ring
	// BootTime is reported by ping (the server's start when zero).
	BootTime time.Time
	// Kernel is the kernel release reported by ping.
	Kernel string
	// BootErrors are the boot steps that failed, reported by ping.
	BootErrors []string
	// Reaper, when set, owns wait(2) for the whole process (the agent is PID 1); exec registers
	// its children with it instead of waiting for them itself.
	Reaper *Reaper
	// ExecCgroup, when set, are the cgroups exec'd processes start in (ExecCgroup).
	ExecCgroup *ExecCgroups
	// ListenerWatch paces watch-listeners (DefaultListenerWatch when zero).
	ListenerWatch ListenerWatch

	SetHostname      func(name string) error
	SetClock         func(t time.Time) error
	ConfigureNetwork func(n agentproto.NetworkConfig) error
	// TrustCA installs a validated CA certificate (InstallCA at the guest's root).
	TrustCA func(ca agentproto.TrustCA) error
	// Reseed mixes host randomness into the kernel's pool and reseeds its RNG.
	Reseed func(seed []byte) error
	// SetMachineID writes a validated machine id.
	SetMachineID func(id string) error
	// PowerOff is called after the shutdown op has been answered.
	PowerOff func()
}

// Server serves the agent protocol on any number of channels.
type Server struct {
	cfg   Config
	log   zerolog.Logger
	start time.Time

	mu       sync.Mutex
	env      map[string]string // from configure
	hostname string
	vsock    bool
	sessions []*yamux.Session // live sessions, newest last; dial-host uses the newest
	execs    map[execKey]int  // running execs by stream: their pids (process groups)
	// lastExec is when an exec last started or ended; look is closed then and at each ping
	// (and replaced): listener watchers look again (lookAgain).
	lastExec time.Time
	look     chan struct{}
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		cfg.Dir = "/"
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.ListenerWatch == (ListenerWatch{}) {
		cfg.ListenerWatch = DefaultListenerWatch
	}
	s := &Server{cfg: cfg, log: cfg.Logger, start: time.Now(), env: map[string]string{}, execs: map[execKey]int{},
		look: make(chan struct{})}
	if cfg.BootTime.IsZero() {
		s.cfg.BootTime = s.start
	}
	s.hostname, _ = os.Hostname()
	return s, nil
}

// SetVsock records whether the AF_VSOCK listener is up (reported by ping).
func (s *Server) SetVsock(up bool) {
	s.mu.Lock()
	s.vsock = up
	s.mu.Unlock()
}

// YamuxConfig is the yamux configuration both ends use. Keepalive is off: a paused or
// snapshotted guest must not tear down the session; the host heartbeats with ping instead.
// Windows are larger than yamux's 256 KiB default for bulk exec output and copies.
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.MaxStreamWindowSize = 4 << 20
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamCloseTimeout = 30 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.AcceptBacklog = 256
	c.LogOutput = io.Discard
	return c
}

// Serve accepts connections on l and serves each until ctx ends or l fails.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
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
			return fmt.Errorf("serve: %w", err)
		}
		go func() {
			if err := s.ServeConn(ctx, c); err != nil {
				s.log.Debug().Err(err).Msg("session ended")
			}
		}()
	}
}

// ServeConn runs the handshake and one yamux session on c, until the session ends.
func (s *Server) ServeConn(ctx context.Context, c net.Conn) error {
	defer c.Close()
	br := bufio.NewReaderSize(c, 4096)
	nonce, err := agentproto.AwaitHello(br)
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if _, err := c.Write(agentproto.Ready(nonce)); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	return s.serveSession(ctx, &bufConn{Conn: c, r: br})
}

// bufConn reads through a bufio.Reader that may hold bytes read past the handshake.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (s *Server) serveSession(ctx context.Context, rwc io.ReadWriteCloser) error {
	sess, err := yamux.Server(rwc, YamuxConfig())
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	s.mu.Lock()
	s.sessions = append(s.sessions, sess)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for i, x := range s.sessions {
			if x == sess {
				s.sessions = append(s.sessions[:i], s.sessions[i+1:]...)
				break
			}
		}
		s.mu.Unlock()
		sess.Close()
	}()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	s.log.Info().Msg("host session started")
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			if errors.Is(err, yamux.ErrSessionShutdown) || errors.Is(err, io.EOF) {
				s.log.Info().Msg("host session ended")
				return nil
			}
			return fmt.Errorf("session: %w", err)
		}
		go s.handleStream(ctx, st)
	}
}

func (s *Server) handleStream(ctx context.Context, st *yamux.Stream) {
	st.SetReadDeadline(time.Now().Add(requestTimeout))
	req, err := agentproto.ReadRequest(st)
	if err != nil {
		if errors.Is(err, errdefs.ErrInvalid) {
			agentproto.WriteMessage(st, agentproto.ErrorResponse(err))
		}
		s.log.Warn().Err(err).Msg("bad request")
		st.Close()
		return
	}
	st.SetReadDeadline(time.Time{})
	s.log.Debug().Str(logOp, string(req.Op)).Msg("request")
	switch req.Op {
	case agentproto.OpPing:
		s.reply(st, agentproto.Response{Pong: s.pong()})
		st.Close()
		s.lookAgain(false)
	case agentproto.OpConfigure:
		s.replyErr(st, s.configure(req.Configure))
		st.Close()
	case agentproto.OpExec:
		s.handleExec(ctx, st, req.Exec)
	case agentproto.OpCopyIn:
		s.handleCopyIn(st, req.CopyIn)
	case agentproto.OpCopyOut:
		s.handleCopyOut(st, req.CopyOut)
	case agentproto.OpConnect:
		s.handleConnect(ctx, st, req.Port)
	case agentproto.OpListeners:
		ls, err := s.listeners()
		if err != nil {
			s.replyErr(st, err)
		} else {
			s.reply(st, agentproto.Response{Listeners: ls})
		}
		st.Close()
	case agentproto.OpWatchListeners:
		s.handleWatchListeners(ctx, st)
	case agentproto.OpLogs:
		s.handleLogs(st)
	case agentproto.OpShutdown:
		s.handleShutdown(st)
	case agentproto.OpExecKill:
		s.killExec(st.Session(), req.Stream)
		s.reply(st, agentproto.Response{})
		st.Close()
	default: // dial-host is host-bound only
		s.replyErr(st, errdefs.Invalid("%s: not served by the agent", req.Op))
		st.Close()
	}
}

func (s *Server) reply(w io.Writer, r agentproto.Response) {
	if err := agentproto.WriteMessage(w, r); err != nil {
		s.log.Debug().Err(err).Msg("write response")
	}
}

func (s *Server) replyErr(w io.Writer, err error) {
	if err == nil {
		s.reply(w, agentproto.Response{})
		return
	}
	s.reply(w, agentproto.ErrorResponse(err))
}

func (s *Server) pong() *agentproto.Pong {
	busy, total := cpuTicks()
	memUsed, memTotal := memUsed()
	s.mu.Lock()
	defer s.mu.Unlock()
	return &agentproto.Pong{
		Version:  agentproto.Version,
		BootTime: s.cfg.BootTime,
		UptimeMS: time.Since(s.start).Milliseconds(),
		Hostname: s.hostname,
		Kernel:   s.cfg.Kernel,
		Vsock:    s.vsock,

		BootErrors: s.cfg.BootErrors,
		CPUBusy:    busy,
		CPUTotal:   total,
		MemUsed:    memUsed,
		MemTotal:   memTotal,
	}
}

var machineIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)

func (s *Server) configure(c *agentproto.ConfigureRequest) error {
	if c == nil {
		return nil
	}
	for k, v := range c.Env {
		if !validEnvKey(k) || !validEnvValue(v) {
			return errdefs.Invalid("configure: bad environment variable name %.40q", k)
		}
	}
	if len(c.Seed) > agentproto.MaxSeedBytes {
		return errdefs.Invalid("configure: seed of %d bytes is above %d", len(c.Seed), agentproto.MaxSeedBytes)
	}
	if c.MachineID != "" && !machineIDRe.MatchString(c.MachineID) {
		return errdefs.Invalid("configure: machine id must be 32 lowercase hex digits")
	}
	// The RNG first: nothing after it (nor any exec) draws from a pool a clone shares.
	if len(c.Seed) > 0 && s.cfg.Reseed != nil {
		if err := s.cfg.Reseed(c.Seed); err != nil {
			return fmt.Errorf("configure: reseed: %w", err)
		}
	}
	if c.MachineID != "" && s.cfg.SetMachineID != nil {
		// A read-only root keeps the image's: not a reason to fail the boot.
		if err := s.cfg.SetMachineID(c.MachineID); err != nil {
			s.log.Warn().Err(err).Msg("configure: machine id not written")
		}
	}
	if c.Hostname != "" {
		if !validHostname(c.Hostname) {
			return errdefs.Invalid("configure: bad hostname %.70q", c.Hostname)
		}
		// The boot set the name the command line gave; the same again would rewrite /etc/hosts
		// for nothing.
		if cur, _ := os.Hostname(); cur != c.Hostname && s.cfg.SetHostname != nil {
			if err := s.cfg.SetHostname(c.Hostname); err != nil {
				return fmt.Errorf("configure: hostname: %w", err)
			}
		}
		s.mu.Lock()
		s.hostname = c.Hostname
		s.mu.Unlock()
	}
	if c.Time != nil && s.cfg.SetClock != nil {
		if err := s.cfg.SetClock(*c.Time); err != nil {
			return fmt.Errorf("configure: clock: %w", err)
		}
	}
	if c.TrustCA != nil {
		if err := checkTrustCA(c.TrustCA); err != nil {
			return err
		}
		if s.cfg.TrustCA == nil {
			return errdefs.Refused("configure: trust_ca: not running as the guest init")
		}
		if err := s.cfg.TrustCA(*c.TrustCA); err != nil {
			return err
		}
	}
	if c.Network != nil {
		if s.cfg.ConfigureNetwork == nil {
			return errdefs.Refused("configure: network: not running as the guest init")
		}
		if err := s.cfg.ConfigureNetwork(*c.Network); err != nil {
			return fmt.Errorf("configure: network: %w", err)
		}
	}
	if len(c.Env) > 0 {
		s.mu.Lock()
		for k, v := range c.Env {
			s.env[k] = v
		}
		s.mu.Unlock()
	}
	return nil
}

func (s *Server) handleShutdown(st *yamux.Stream) {
	if s.cfg.PowerOff == nil {
		s.replyErr(st, errdefs.Refused("shutdown: not running as the guest init"))
		st.Close()
		return
	}
	s.reply(st, agentproto.Response{})
	st.Close()
	s.log.Info().Msg("shutdown requested")
	go s.cfg.PowerOff()
}

func (s *Server) handleLogs(st *yamux.Stream) {
	defer st.Close()
	s.reply(st, agentproto.Response{})
	var data []byte
	if s.cfg.Logs != nil {
		data = s.cfg.Logs.Bytes()
	}
	fw := agentproto.NewFrameWriter(st)
	for len(data) > 0 {
		n := min(len(data), agentproto.MaxFramePayload)
		if err := fw.WriteFrame(agentproto.FrameData, data[:n]); err != nil {
			return
		}
		data = data[n:]
	}
	fw.WriteFrame(agentproto.FrameEnd, nil)
}

func validEnvKey(k string) bool {
	if k == "" || len(k) > 256 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c == '=' || c == 0 {
			return false
		}
	}
	return true
}

func validEnvValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] == 0 {
			return false
		}
	}
	return true
}

func validHostname(h string) bool {
	if len(h) == 0 || len(h) > 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.'
		if !ok {
			return false
		}
	}
	return true
}
