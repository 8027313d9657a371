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
)

// How the listeners of a guest are watched for the port forwarder.
var (
	// ListenerPoll is how often the agent is asked for its listening sockets.
	ListenerPoll = 500 * time.Millisecond
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

// watchListeners polls the guest's listening TCP sockets and publishes the forwardable set on
// nexus.events.ports.<id> when it changes and every ListenerRepublish; an empty set when the
// machine stops (ctx ends). A paused guest does not answer: its last set stands, unpublished.
func (s *Service) watchListeners(ctx context.Context, m *machine) {
	if portForwardOff(m.dir) {
		return
	}
	var last []portfwdapi.Port
	var published time.Time
	publish := func(ports []portfwdapi.Port) {
		ev := portfwdapi.ListenersEvent{Type: portfwdapi.TypeListeners, ID: m.id, Name: m.name, Ports: ports, Time: time.Now().UTC()}
		if ev.Ports == nil {
			ev.Ports = []portfwdapi.Port{}
		}
		b, _ := json.Marshal(ev)
		if err := s.cfg.Bus.Publish(portfwdapi.EventSubject(m.id), b); err != nil {
			s.log.Warn().Err(err).Str("sandbox", m.name).Msg("publish listeners")
		}
		published = time.Now()
	}
	t := time.NewTicker(ListenerPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if !published.IsZero() {
				publish(nil)
			}
			return
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ls, err := m.agent.Listeners(lctx)
		cancel()
		if err != nil {
			continue // paused, or busy: keep the last set
		}
		ports := forwardable(ls)
		if published.IsZero() || !slices.Equal(ports, last) || time.Since(published) >= ListenerRepublish {
			last = ports
			publish(ports)
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
