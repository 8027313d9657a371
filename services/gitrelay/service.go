// Package gitrelay is the git-over-SSH relay (DESIGN §6): a guest's git runs ssh through the
// agent's shim (GIT_SSH_COMMAND=nexus-agent ssh-shim), which sends the ssh argv over the
// hybrid-vsock channel to this service. Before it starts anything the relay checks that the
// command is exactly git-upload-pack or git-receive-pack of one owner/repo and that the repo is
// bound to the sandbox (--repo) or listed under its .nexus/config.yaml egress.policy; on a push
// it reads the pkt-line ref updates and refuses any ref outside the sandbox's allowed branches
// before a byte of them reaches the remote. Then it runs the host's real ssh (the host's
// SSH_AUTH_SOCK authenticates; no key ever enters the guest) and relays bytes both ways. Every
// decision is one audit event (layer git).
//
// The service learns which sandboxes run from the lifecycle events (an ordered JetStream
// consumer of nexus.events.sandbox.*, last event per sandbox first, so a restart picks up the
// running ones) and listens on $NEXUS_HOME/sandboxes/<id>/vsock.sock_2222 for each. It reads the
// sandbox record (KV nexus_sandboxes) on every connection, so the policy is always current.
package gitrelay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	gwapi "github.com/IniZio/nexus/pkg/api/gateway"
	api "github.com/IniZio/nexus/pkg/api/gitrelay"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// Config configures the relay.
type Config struct {
	Bus     *nats.Conn
	Home    home.Dir // sandbox sockets live under Home.Sandbox(id)
	Host    string
	Log     zerolog.Logger
	Version string
	// SSH is how the host's ssh is run (the --gitrelay-* settings in production).
	SSH SSHConfig
	// Audit receives every decision; default a JetStream publisher on Bus.
	Audit audit.Sink
	// Records reads a sandbox record by name; default KV nexus_sandboxes on Bus.
	Records func(ctx context.Context, name string) (*gwapi.Sandbox, error)
	// MaxSessions bounds concurrent relayed sessions per sandbox; default 16.
	MaxSessions int
}

// Service is the relay service.
type Service struct {
	cfg Config
	log zerolog.Logger

	mu        sync.Mutex
	sandboxes map[string]*listener // by id
	wg        sync.WaitGroup
}

// listener is the relay's socket for one running sandbox.
type listener struct {
	id, name string
	ln       *net.UnixListener
	path     string
	sessions chan struct{} // semaphore
	cancel   context.CancelFunc
}

// New returns the relay service.
func New(cfg Config) (*Service, error) {
	if cfg.Host == "" {
		cfg.Host = bus.LocalHost
	}
	if cfg.Version == "" {
		cfg.Version = "0.0.0-dev" // micro requires SemVer
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = 16
	}
	cfg.SSH.defaults()
	return &Service{cfg: cfg, log: cfg.Log, sandboxes: map[string]*listener{}}, nil
}

// Log field keys.
const (
	logSandbox = "sandbox"
	logID      = "id"
)

// idRE is what a sandbox id looks like; anything else never reaches a path.
var idRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Run follows sandbox lifecycle events, relays guest sessions and serves the service
// registration until ctx ends. Its sockets are removed when it returns.
func (s *Service) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.cfg.Audit == nil {
		pub, err := audit.NewSpooledPublisher(s.cfg.Bus, bus.UserGitrelay, s.log, s.cfg.Home.AuditSpool("gitrelay"))
		if err != nil {
			return fmt.Errorf("gitrelay: audit: %w", err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			pub.Close(cctx)
		}()
		s.cfg.Audit = pub
	}
	if s.cfg.Records == nil {
		kv, err := bus.KV(ctx, s.cfg.Bus, bus.KVSandboxes)
		if err != nil {
			return fmt.Errorf("gitrelay: %w", err)
		}
		s.cfg.Records = kvRecords(kv)
	}
	js, err := jetstream.New(s.cfg.Bus)
	if err != nil {
		return fmt.Errorf("gitrelay: %w", err)
	}
	cons, err := js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{gwapi.EventSubject("*")},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("gitrelay: lifecycle events: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { s.onEvent(ctx, m.Subject(), m.Data()) })
	if err != nil {
		return fmt.Errorf("gitrelay: lifecycle events: %w", err)
	}
	defer cc.Stop()
	defer s.shutdown()
	return bus.Serve(ctx, s.cfg.Bus, bus.ServiceInfo{Name: "gitrelay", Version: s.cfg.Version, Host: s.cfg.Host,
		Description: "git over SSH relay with repo and branch policy"}, s.log, nil)
}

func kvRecords(kv jetstream.KeyValue) func(ctx context.Context, name string) (*gwapi.Sandbox, error) {
	return func(ctx context.Context, name string) (*gwapi.Sandbox, error) {
		e, err := kv.Get(ctx, name)
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return nil, errdefs.NotFound("no sandbox named %s", name)
			}
			return nil, fmt.Errorf("gitrelay: read sandbox %s: %w", name, err)
		}
		var rec gwapi.Sandbox
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return nil, fmt.Errorf("gitrelay: sandbox record %s is damaged: %w", name, err)
		}
		return &rec, nil
	}
}

// maxEventBytes bounds a lifecycle event.
const maxEventBytes = 64 << 10

func (s *Service) onEvent(ctx context.Context, subject string, data []byte) {
	id := strings.TrimPrefix(subject, bus.EventsPrefix+".sandbox.")
	var ev gwapi.Event
	if len(data) > maxEventBytes || json.Unmarshal(data, &ev) != nil || ev.ID != id || !idRE.MatchString(id) {
		return
	}
	switch {
	case ev.Type == "state" && (ev.To == gwapi.StateRunning || ev.To == gwapi.StatePaused):
		s.open(ctx, id, ev.Sandbox)
	case ev.Type == "state" && ev.To == gwapi.StateStarting:
		// Keep nothing from a previous run: the vmm's teardown removed the old socket file.
		s.close(id)
	default: // stopping, stopped, failed, removing, removed
		s.close(id)
	}
}

// open listens for sandbox id unless it already does on a socket that still exists. A sandbox
// whose directory is not on this machine (another host's vmm runs it) is skipped.
func (s *Service) open(ctx context.Context, id, name string) {
	dir := s.cfg.Home.Sandbox(id)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return
	}
	path := filepath.Join(dir, api.SocketName)
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.sandboxes[id]; l != nil {
		if _, err := os.Stat(path); err == nil {
			l.name = name
			return
		}
		s.closeLocked(id)
	}
	os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err == nil {
		if err = os.Chmod(path, 0o600); err != nil {
			ln.Close()
		}
	}
	if err != nil {
		s.log.Warn().Err(err).Str(logSandbox, name).Msg("gitrelay: cannot listen")
		return
	}
	lctx, cancel := context.WithCancel(ctx)
	l := &listener{id: id, name: name, ln: ln, path: path, sessions: make(chan struct{}, s.cfg.MaxSessions), cancel: cancel}
	s.sandboxes[id] = l
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.accept(lctx, l)
	}()
	s.log.Debug().Str(logSandbox, name).Str(logID, id).Msg("gitrelay: listening")
}

func (s *Service) close(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked(id)
}

func (s *Service) closeLocked(id string) {
	l := s.sandboxes[id]
	if l == nil {
		return
	}
	delete(s.sandboxes, id)
	l.cancel()
	l.ln.Close() // removes the socket file
}

func (s *Service) shutdown() {
	s.mu.Lock()
	for id := range s.sandboxes {
		s.closeLocked(id)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// accept serves one sandbox's socket until it is closed; open sessions end with lctx.
func (s *Service) accept(ctx context.Context, l *listener) {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			return
		}
		select {
		case l.sessions <- struct{}{}:
		default:
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				refuseBusy(c)
			}()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-l.sessions }()
			s.serve(ctx, l, c)
		}()
	}
}

// refuseBusy answers a session over the limit without reading its request.
func refuseBusy(c *net.UnixConn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	api.WriteFrame(c, api.FrameStderr, []byte("nexus: git relay: too many sessions for this sandbox; try again\n"))
	api.WriteFrame(c, api.FrameExit, api.ExitPayload(exitRefused))
}
