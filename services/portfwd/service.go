// Package portfwd makes a guest listener appear at the same port on 127.0.0.1 of the host.
//
// The vmm publishes the full set of forwardable guest listeners of each sandbox on
// nexus.events.ports.<id> (on change and every few seconds); this service binds
// 127.0.0.1:<port> for each and relays every connection through the sandbox's hybrid-vsock
// socket ($NEXUS_HOME/sandboxes/<id>/vsock.sock: "CONNECT <port>\n" → "OK <port>\n"). The
// number is never changed: a port already taken on the host, or claimed by another sandbox
// first, is a conflict that is reported, never renumbered. Forwards end when the guest
// listener closes and when the sandbox stops, pauses, fails or is removed (lifecycle events on
// nexus.events.sandbox.<id>). Forwards are recorded in KV nexus_ports, so a restarted service
// binds them again and then reconciles with the next listener set.
package portfwd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	gwapi "github.com/IniZio/nexus/pkg/api/gateway"
	api "github.com/IniZio/nexus/pkg/api/portfwd"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

// Config configures the forwarder.
type Config struct {
	Bus     *nats.Conn
	Home    home.Dir // sandbox sockets live under Home.Sandbox(id)
	Host    string
	Log     zerolog.Logger
	Version string
	// BindIP is the host address forwards listen on; default 127.0.0.1.
	BindIP string
	// RestoreGrace is how long a forward restored from KV after a restart lives without a
	// listener set confirming it; default 15s (three vmm republish periods).
	RestoreGrace time.Duration
	// ConnectTimeout bounds the hybrid-vsock handshake of one relayed connection; default 10s.
	ConnectTimeout time.Duration
	// MaxConns bounds the open relayed connections of one forward; default 1024.
	MaxConns int
}

// Service is the port-forward service.
type Service struct {
	cfg Config
	log zerolog.Logger
	kv  jetstream.KeyValue
	js  jetstream.JetStream

	mu        sync.Mutex
	sandboxes map[string]*sandbox // by id
	byPort    map[uint16]*forward // host ports this service holds (state forwarding)
}

// sandbox is what the service knows of one sandbox.
type sandbox struct {
	id, name string
	state    gwapi.State       // last lifecycle state seen; "" unknown
	checked  bool              // the last lifecycle event was looked up in the stream
	want     map[uint16]string // guest port → guest address, from the last listener set
	fwds     map[uint16]*forward
	// restoredAt is set for a sandbox restored from KV until a listener set confirms it.
	restoredAt time.Time
}

// New returns the port-forward service.
func New(cfg Config) (*Service, error) {
	if cfg.Host == "" {
		cfg.Host = bus.LocalHost
	}
	if cfg.Version == "" {
		cfg.Version = "0.0.0-dev" // micro requires SemVer
	}
	if cfg.BindIP == "" {
		cfg.BindIP = "127.0.0.1"
	}
	if cfg.RestoreGrace == 0 {
		cfg.RestoreGrace = 15 * time.Second
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 1024
	}
	return &Service{cfg: cfg, log: cfg.Log, sandboxes: map[string]*sandbox{}, byPort: map[uint16]*forward{}}, nil
}

// Run binds the forwards recorded in KV, follows listener and lifecycle events and serves the
// list API until ctx ends. Host ports are released when it returns; the KV records stay.
func (s *Service) Run(ctx context.Context) error {
	kv, err := bus.KV(ctx, s.cfg.Bus, bus.KVPorts)
	if err != nil {
		return fmt.Errorf("portfwd: %w", err)
	}
	s.kv = kv
	if s.js, err = jetstream.New(s.cfg.Bus); err != nil {
		return fmt.Errorf("portfwd: %w", err)
	}
	// Subscribe before restoring so no event between the two is lost.
	msgs := make(chan *nats.Msg, 4096)
	var subs []*nats.Subscription
	for _, subj := range []string{api.EventWildcard, gwapi.EventSubject("*")} {
		sub, err := s.cfg.Bus.ChanSubscribe(subj, msgs)
		if err != nil {
			return fmt.Errorf("portfwd: subscribe %s: %w", subj, err)
		}
		sub.SetPendingLimits(-1, 64<<20)
		subs = append(subs, sub)
	}
	defer func() {
		for _, sub := range subs {
			sub.Unsubscribe()
		}
	}()
	s.restore(ctx)
	defer s.shutdown()

	info := bus.ServiceInfo{Name: "portfwd", Version: s.cfg.Version, Host: s.cfg.Host,
		Description: "guest listeners at the same port on the host"}
	done := make(chan error, 1)
	go func() {
		done <- bus.Serve(ctx, s.cfg.Bus, info, s.log, func(svc *bus.Service) error {
			return api.List.Serve(svc, s.list)
		})
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return <-done
		case err := <-done:
			return err
		case m := <-msgs:
			if ctx.Err() == nil {
				s.handle(ctx, m)
			}
		case <-tick.C:
			s.expireRestored(ctx)
		}
	}
}

// idRE is what a sandbox id looks like; anything else never reaches a path, subject or key.
var idRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// maxEventBytes bounds an event body.
const maxEventBytes = 1 << 20

func (s *Service) handle(ctx context.Context, m *nats.Msg) {
	if len(m.Data) > maxEventBytes {
		return
	}
	switch {
	case strings.HasPrefix(m.Subject, bus.EventsPrefix+".ports."):
		ev, err := decodeListeners(m.Subject, m.Data)
		if err != nil {
			if !errors.Is(err, errNotListeners) {
				s.log.Warn().Err(err).Str("subject", m.Subject).Msg("bad listener event")
			}
			return
		}
		if !s.ours(ev.Host) {
			return // another host's sandbox: its own forwarder opens its ports there
		}
		s.onListeners(ctx, ev)
	case strings.HasPrefix(m.Subject, bus.EventsPrefix+".sandbox."):
		var ev gwapi.Event
		id := strings.TrimPrefix(m.Subject, bus.EventsPrefix+".sandbox.")
		if json.Unmarshal(m.Data, &ev) != nil || ev.ID != id || !idRE.MatchString(id) {
			return
		}
		s.onLifecycle(ctx, ev)
	}
}

// ours says whether a listener set or a stored forward of host is this forwarder's: its host's,
// or one that names no host (a vmm or record from before hosts were named).
func (s *Service) ours(host string) bool { return host == "" || host == s.cfg.Host }

// errNotListeners marks a port event that is not a listener set (our own forward events).
var errNotListeners = errors.New("not a listener set")

// decodeListeners parses and checks a listener set: the id must match the subject, ports must
// be in range; duplicates collapse to the first address given.
func decodeListeners(subject string, data []byte) (api.ListenersEvent, error) {
	var ev api.ListenersEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return ev, fmt.Errorf("listener event: %w", err)
	}
	if ev.Type != api.TypeListeners {
		return ev, errNotListeners
	}
	id := strings.TrimPrefix(subject, bus.EventsPrefix+".ports.")
	if ev.ID != id || !idRE.MatchString(id) {
		return ev, fmt.Errorf("listener event: id %q does not match its subject", ev.ID)
	}
	if len(ev.Name) > 200 {
		return ev, fmt.Errorf("listener event: name too long")
	}
	if len(ev.Ports) > api.MaxPort-api.MinPort+1 {
		return ev, fmt.Errorf("listener event: %d ports is more than the range holds", len(ev.Ports))
	}
	seen := map[uint16]bool{}
	ports := ev.Ports[:0]
	for _, p := range ev.Ports {
		if !api.InRange(int(p.Port)) || seen[p.Port] || len(p.Addr) > 64 {
			continue
		}
		seen[p.Port] = true
		ports = append(ports, p)
	}
	ev.Ports = ports
	return ev, nil
}

// active reports whether a sandbox in state st may have forwards. An unknown state counts as
// active: the vmm publishes listener sets only for VMs it runs.
func active(st gwapi.State) bool {
	return st == "" || st == gwapi.StateRunning || st == gwapi.StateStarting
}

func (s *Service) sandbox(id, name string) *sandbox {
	sb, ok := s.sandboxes[id]
	if !ok {
		sb = &sandbox{id: id, name: id, fwds: map[uint16]*forward{}}
		s.sandboxes[id] = sb
	}
	if name != "" && name != id {
		sb.name = name
	}
	return sb
}

func (s *Service) onListeners(ctx context.Context, ev api.ListenersEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandbox(ev.ID, ev.Name)
	if sb.state == "" && !sb.checked {
		sb.state = s.lastState(ctx, sb.id)
		sb.checked = true
	}
	sb.restoredAt = time.Time{}
	sb.want = map[uint16]string{}
	for _, p := range ev.Ports {
		sb.want[p.Port] = p.Addr
	}
	if !active(sb.state) {
		return // a set that raced a stop or pause
	}
	s.apply(ctx, sb)
	if len(sb.want) == 0 && len(sb.fwds) == 0 && sb.state == "" {
		delete(s.sandboxes, sb.id)
	}
}

func (s *Service) onLifecycle(ctx context.Context, ev gwapi.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandbox(ev.ID, ev.Sandbox)
	sb.state, sb.checked = ev.To, true
	switch ev.To {
	case gwapi.StateRunning, gwapi.StateStarting:
		s.apply(ctx, sb) // a resume: the set from before the pause comes back
	case gwapi.StatePaused:
		s.suspend(ctx, sb, "sandbox paused")
	case gwapi.StateRemoving:
		s.suspend(ctx, sb, "sandbox removed")
		sb.want = nil
	default: // stopping, stopped, failed, created
		s.suspend(ctx, sb, "sandbox "+string(ev.To))
		sb.want = nil
	}
}

// lastState looks up the last lifecycle event of a sandbox in the events stream, for a
// sandbox this process has not seen an event of (after a restart); "" when there is none.
func (s *Service) lastState(ctx context.Context, id string) gwapi.State {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return ""
	}
	m, err := st.GetLastMsgForSubject(ctx, gwapi.EventSubject(id))
	if err != nil {
		return ""
	}
	var ev gwapi.Event
	if json.Unmarshal(m.Data, &ev) != nil {
		return ""
	}
	return ev.To
}

// apply makes the forwards of sb match its wanted set: ports no longer wanted are released,
// wanted ones are claimed (or reported in conflict), conflicts are tried again.
func (s *Service) apply(ctx context.Context, sb *sandbox) {
	for p, f := range sb.fwds {
		if _, ok := sb.want[p]; !ok {
			s.release(ctx, sb, f, "listener closed", false)
		}
	}
	ports := make([]uint16, 0, len(sb.want))
	for p := range sb.want {
		ports = append(ports, p)
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i] < ports[j] })
	for _, p := range ports {
		s.claim(ctx, sb, p)
	}
}

// claim binds host port p for sb, or records a conflict naming what holds it.
func (s *Service) claim(ctx context.Context, sb *sandbox, p uint16) {
	addr := sb.want[p]
	f := sb.fwds[p]
	if f != nil && f.state == api.StateForwarding {
		if f.addr != addr {
			f.addr = addr
			s.store(ctx, f)
		}
		return
	}
	if f == nil {
		f = &forward{id: sb.id, name: sb.name, port: p, since: time.Now().UTC()}
		sb.fwds[p] = f
	}
	f.addr, f.name = addr, sb.name
	if other := s.byPort[p]; other != nil {
		s.conflict(ctx, f, "sandbox "+other.name)
		return
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(s.cfg.BindIP, strconv.Itoa(int(p))))
	if err != nil {
		holder := f.holder
		if f.state != api.StateConflict || strings.HasPrefix(holder, "sandbox ") {
			holder = hostHolder(p, err)
		}
		s.conflict(ctx, f, holder)
		return
	}
	f.state, f.holder, f.since = api.StateForwarding, "", time.Now().UTC()
	f.start(s, ln, s.cfg.Home.Sandbox(sb.id))
	s.byPort[p] = f
	s.store(ctx, f)
	s.publish(f, "")
	s.log.Info().Str("sandbox", sb.name).Uint16("port", p).Msg("forwarding")
}

func (s *Service) conflict(ctx context.Context, f *forward, holder string) {
	if f.state == api.StateConflict && f.holder == holder {
		return
	}
	f.state, f.holder, f.since = api.StateConflict, holder, time.Now().UTC()
	s.store(ctx, f)
	s.publish(f, "")
	s.log.Warn().Str("sandbox", f.name).Uint16("port", f.port).Str("holder", holder).Msg("port conflict: not forwarded")
}

// release ends one forward (or conflict) of sb. closeConns also ends its relayed connections
// (the sandbox went away); a closed guest listener leaves established connections alone.
// A freed host port goes to the sandbox that waited longest for it.
func (s *Service) release(ctx context.Context, sb *sandbox, f *forward, reason string, closeConns bool) {
	delete(sb.fwds, f.port)
	held := f.state == api.StateForwarding
	if held {
		f.stop(closeConns)
		delete(s.byPort, f.port)
	}
	s.unstore(ctx, f)
	f.state = api.StateReleased
	s.publish(f, reason)
	s.log.Info().Str("sandbox", f.name).Uint16("port", f.port).Str("reason", reason).Msg("forward released")
	if held {
		s.handOver(ctx, f.port)
	}
}

// handOver gives a freed port to the sandbox whose conflict on it is oldest.
func (s *Service) handOver(ctx context.Context, p uint16) {
	var next *sandbox
	var since time.Time
	for _, sb := range s.sandboxes {
		f := sb.fwds[p]
		if f == nil || f.state != api.StateConflict || !active(sb.state) {
			continue
		}
		if next == nil || f.since.Before(since) {
			next, since = sb, f.since
		}
	}
	if next != nil {
		s.claim(ctx, next, p)
	}
}

// suspend ends every forward of sb but keeps its wanted set (a resume brings it back).
func (s *Service) suspend(ctx context.Context, sb *sandbox, reason string) {
	for _, f := range sb.fwds {
		s.release(ctx, sb, f, reason, true)
	}
}

// expireRestored releases forwards restored from KV that no listener set confirmed in time:
// their sandbox is gone or no longer listening.
func (s *Service) expireRestored(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, sb := range s.sandboxes {
		if sb.restoredAt.IsZero() || time.Since(sb.restoredAt) < s.cfg.RestoreGrace {
			continue
		}
		s.suspend(ctx, sb, "not confirmed by the vmm after a restart")
		delete(s.sandboxes, id)
	}
}

func (s *Service) publish(f *forward, reason string) {
	ev := api.ForwardEvent{Type: api.TypeForward, ID: f.id, Name: f.name, Port: f.port, State: f.state,
		Holder: f.holder, Reason: reason, Time: time.Now().UTC()}
	b, _ := json.Marshal(ev)
	if err := s.cfg.Bus.Publish(api.EventSubject(f.id), b); err != nil {
		s.log.Warn().Err(err).Msg("publish port event")
	}
}

// shutdown closes every host listener and relayed connection; KV keeps the records.
func (s *Service) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, f := range s.byPort {
		f.stop(true)
		delete(s.byPort, p)
	}
}

// list answers nexus.portfwd.<host>.list: forwards and conflicts, by sandbox then port.
func (s *Service) list(_ context.Context, r api.ListRequest) ([]api.Forward, error) {
	s.mu.Lock()
	out := []api.Forward{}
	for _, sb := range s.sandboxes {
		if r.ID != "" && sb.id != r.ID {
			continue
		}
		for _, f := range sb.fwds {
			rec := s.record(f)
			rec.Conns, rec.Accepted = f.activity()
			out = append(out, rec)
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Sandbox != out[j].Sandbox {
			return out[i].Sandbox < out[j].Sandbox
		}
		return out[i].Port < out[j].Port
	})
	return out, nil
}

func (s *Service) record(f *forward) api.Forward {
	return api.Forward{ID: f.id, Sandbox: f.name, Port: f.port, GuestAddr: f.addr,
		HostAddr: net.JoinHostPort(s.cfg.BindIP, strconv.Itoa(int(f.port))), State: f.state, Holder: f.holder,
		Since: f.since, Host: s.cfg.Host}
}
