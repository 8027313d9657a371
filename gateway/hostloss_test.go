package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// TestHostLoss: the running and paused sandboxes of a host whose heartbeat expired are failed
// with "host X lost" (the gateway's own host and other states are left alone); when the host
// heartbeats again, a sandbox whose VM still runs there is running again and one whose VM is
// gone is cleaned up and stays failed, saying so.
func TestHostLoss(t *testing.T) {
	tg := newTestGateway(t)
	beat, check := tg.hostBeats(t)
	survivor := tg.add(t, &api.Sandbox{Name: "default/survivor", Host: "b"}, api.StateRunning)
	gone := tg.add(t, &api.Sandbox{Name: "default/gone", Host: "b"}, api.StateRunning)
	stopped := tg.add(t, &api.Sandbox{Name: "default/stopped", Host: "b"}, api.StateStopped)
	local := tg.add(t, &api.Sandbox{Name: "default/local"}, api.StateRunning)
	other := tg.add(t, &api.Sandbox{Name: "default/other", Host: "c"}, api.StateRunning)
	started := tg.get(t, survivor).StartedAt

	now := time.Now()
	beat(bus.LocalHost, now.Add(-time.Hour)) // its own host's vmm restarting: reconcile's, not this
	beat("b", now)
	beat("c", now)
	check()
	for _, sb := range []*api.Sandbox{survivor, gone, local, other} {
		if st := tg.get(t, sb).State; st != api.StateRunning {
			t.Fatalf("%s is %s with every host up; want running", sb.Name, st)
		}
	}

	beat("b", now.Add(-bus.HostTTL-time.Second))
	check()
	for _, sb := range []*api.Sandbox{survivor, gone} {
		cur := tg.get(t, sb)
		if cur.State != api.StateFailed || cur.Reason != "host b lost" {
			t.Errorf("%s of lost host b: %s (%q); want failed (\"host b lost\")", sb.Name, cur.State, cur.Reason)
		}
	}
	for sb, want := range map[*api.Sandbox]api.State{stopped: api.StateStopped, local: api.StateRunning, other: api.StateRunning} {
		if st := tg.get(t, sb).State; st != want {
			t.Errorf("%s: %s after host b was lost; want %s", sb.Name, st, want)
		}
	}

	// b is back: survivor's VM still runs there, gone's does not.
	tg.fake.mu.Lock()
	tg.fake.running = map[string]bool{survivor.ID: true}
	tg.fake.mu.Unlock()
	beat("b", time.Now())
	check()
	cur := tg.get(t, survivor)
	if cur.State != api.StateRunning || cur.Reason != "" || !cur.StartedAt.Equal(started) {
		t.Errorf("survivor after b is back: %s (%q, started %v); want running again, started %v", cur.State, cur.Reason, cur.StartedAt, started)
	}
	cur = tg.get(t, gone)
	if cur.State != api.StateFailed || !strings.Contains(cur.Reason, "host b lost; its VM did not survive") || !strings.Contains(cur.Reason, "nexus start default/gone") {
		t.Errorf("gone after b is back: %s (%q); want failed, saying its VM did not survive", cur.State, cur.Reason)
	}
	// Settled once: another check changes nothing.
	rev := cur.Revision
	check()
	if cur = tg.get(t, gone); cur.Revision != rev {
		t.Errorf("gone was written again by a later check: %s (%q)", cur.State, cur.Reason)
	}
}

// hostBeats gives a host-loss test its two moves: beat writes host's heartbeat as of at (an
// old at is an expired one), and check runs one sweep of the gateway's host-loss check.
func (tg *testGateway) hostBeats(t *testing.T) (beat func(host string, at time.Time), check func()) {
	kv, err := bus.KV(tg.ctx, tg.bus.Connect(t, bus.UserAdmin), bus.KVHosts)
	if err != nil {
		t.Fatal(err)
	}
	beat = func(host string, at time.Time) {
		t.Helper()
		if err := bus.Beat(tg.ctx, kv, bus.HostBeat{Host: host, MemoryMiB: 4096, At: at}); err != nil {
			t.Fatal(err)
		}
	}
	return beat, func() { tg.checkHosts(tg.ctx, tg.hostStates(tg.ctx)) }
}

// TestLostHostNamedInErrors: logs, ports, exec and cp of a sandbox whose host's heartbeat has
// expired fail saying the host is lost, not that its vmm "did not answer" or "is not running".
func TestLostHostNamedInErrors(t *testing.T) {
	tg := newTestGateway(t)
	beat, _ := tg.hostBeats(t)
	sb := tg.add(t, &api.Sandbox{Name: "default/far", Host: "b"}, api.StateRunning)
	tg.fake.silence(vmmapi.Logs.Subject("b"), vmmapi.Exec.Subject("b"), vmmapi.Copy.Subject("b"))
	beat(bus.LocalHost, time.Now())
	beat("b", time.Now())
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(tg.ctx, time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	_, err := tg.logs(short(), api.LogsRequest{Name: sb.Name})
	if err == nil || strings.Contains(err.Error(), "host b lost") {
		t.Fatalf("logs while b heartbeats but its vmm is silent: %v; want the vmm's own error", err)
	}
	beat("b", time.Now().Add(-bus.HostTTL-time.Second))
	calls := map[string]func() error{
		"logs":  func() error { _, err := tg.logs(short(), api.LogsRequest{Name: sb.Name}); return err },
		"ports": func() error { _, err := tg.ports(short(), api.PortsRequest{Name: sb.Name}); return err },
		"exec": func() error {
			_, err := tg.exec(short(), api.ExecRequest{Name: sb.Name, SID: "s1", Argv: []string{"true"}})
			return err
		},
		"cp": func() error {
			_, err := tg.copy(short(), api.CopyRequest{Name: sb.Name, SID: "s2", Path: "/x"})
			return err
		},
	}
	for verb, call := range calls {
		err := call()
		if err == nil || !strings.Contains(err.Error(), "host b lost") || !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("%s of a sandbox on lost host b: %v; want unavailable, naming host b lost", verb, err)
		}
	}
}
