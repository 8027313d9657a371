package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// How the listeners of a guest are watched for the port forwarder.
var (
	// ListenerPoll is how often an agent that cannot push its listeners (one from before
	// watch-listeners, in a VM adopted from an older nexus) is asked for them, and how long a
	// watch that failed waits before it is opened again.
	ListenerPoll = 500 * time.Millisecond
	// ListenerGap is the least time between two sets taken from a guest that pushes them: a
	// guest pushing faster only waits (its stream's window fills).
	ListenerGap = 100 * time.Millisecond
	// ListenerRepublish is how often an unchanged set is published again, so a restarted
	// portfwd converges without asking.
	ListenerRepublish = 5 * time.Second
)

// noPortForwardFile in a sandbox's directory marks a sandbox created with --no-port-forward.
// It is a file, not a field, so that a restarted vmm adopting the VM knows it too.
const noPortForwardFile = "no-port-forward"

// setPortForward records whether the listeners of the sandbox in dir are forwarded.
func setPortForward(dir string, on bool) error {
	p := filepath.Join(dir, noPortForwardFile)
	if on {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return os.WriteFile(p, nil, 0o600)
}

func portForwardOff(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, noPortForwardFile))
	return err == nil
}

// watchListeners follows the guest's listening TCP sockets and publishes the forwardable set on
// nexus.events.ports.<id> when it changes and every ListenerRepublish; an empty set when the
// machine stops (ctx ends). The agent pushes its set when it changes (watch-listeners); one
// that predates that is asked every ListenerPoll instead. A paused guest sends nothing: its last
// set stands, republished.
func (s *Service) watchListeners(ctx context.Context, m *machine) {
	if portForwardOff(m.dir) {
		return
	}
	sets := make(chan []portfwdapi.Port, 1)
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		s.followListeners(ctx, m, func(ports []portfwdapi.Port) {
			select { // only the newest set matters; this is its only sender
			case <-sets:
			default:
			}
			sets <- ports
		})
	}()
	defer func() { <-followed }()
	var last []portfwdapi.Port
	var published time.Time
	publish := func(ports []portfwdapi.Port) {
		ev := portfwdapi.ListenersEvent{Type: portfwdapi.TypeListeners, ID: m.id, Name: m.name, Ports: ports, Time: time.Now().UTC(), Host: s.cfg.Host}
		if ev.Ports == nil {
			ev.Ports = []portfwdapi.Port{}
		}
		b, _ := json.Marshal(ev)
		if err := s.cfg.Bus.Publish(portfwdapi.EventSubject(m.id), b); err != nil {
			s.log.Warn().Err(err).Str("sandbox", m.name).Msg("publish listeners")
		}
		published = time.Now()
	}
	t := time.NewTicker(ListenerRepublish)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if !published.IsZero() {
				publish(nil)
			}
			return
		case ports := <-sets:
			if published.IsZero() || !slices.Equal(ports, last) {
				last = ports
				publish(ports)
			}
		case <-t.C:
			if !published.IsZero() {
				publish(last)
			}
		}
	}
}

// followListeners hands found each forwardable set of m's guest, pushed by its agent or, from
// an agent that cannot push, asked for every ListenerPoll, until ctx ends or the agent's
// session does.
func (s *Service) followListeners(ctx context.Context, m *machine, found func([]portfwdapi.Port)) {
	for ctx.Err() == nil {
		err := m.agent.WatchListeners(ctx, ListenerGap, func(ls []agentproto.Listener) { found(forwardable(ls)) })
		if errors.Is(err, errdefs.ErrInvalid) {
			s.log.Debug().Str("sandbox", m.name).Msg("the agent cannot push its listeners: polling them")
			s.pollListeners(ctx, m, found)
			return
		}
		select { // the stream failed: open it again while the session lives
		case <-ctx.Done():
			return
		case <-m.agent.Done():
			return
		case <-time.After(ListenerPoll):
		}
	}
}

// pollListeners asks an agent that cannot push its listeners for them every ListenerPoll. A
// paused or busy guest does not answer: its last set stands.
func (s *Service) pollListeners(ctx context.Context, m *machine, found func([]portfwdapi.Port)) {
	t := time.NewTicker(ListenerPoll)
	defer t.Stop()
	for {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ls, err := m.agent.Listeners(lctx)
		cancel()
		if err == nil {
			found(forwardable(ls))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// forwardable keeps the TCP listeners the forwarder can reach: ports in the forwarded range,
// on an address the agent's loopback dial reaches (any address, 127.0.0.1 or ::1), one entry
// per port, sorted by port.
func forwardable(ls []agentproto.Listener) []portfwdapi.Port {
	var out []portfwdapi.Port
	for _, l := range ls {
		if l.Proto != "tcp" && l.Proto != "tcp6" || !portfwdapi.InRange(int(l.Port)) {
			continue
		}
		ip, err := netip.ParseAddr(l.IP)
		if err != nil || !(ip.IsUnspecified() || ip.IsLoopback()) {
			continue
		}
		if slices.ContainsFunc(out, func(p portfwdapi.Port) bool { return p.Port == l.Port }) {
			continue
		}
		out = append(out, portfwdapi.Port{Port: l.Port, Addr: ip.String()})
	}
	slices.SortFunc(out, func(a, b portfwdapi.Port) int { return int(a.Port) - int(b.Port) })
	return out
}
