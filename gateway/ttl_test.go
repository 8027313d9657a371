package gateway

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// TestTTLSweep: a sandbox past its --ttl is removed whatever its state, with the reason on its
// event stream; one with time left, or without a ttl, stays.
func TestTTLSweep(t *testing.T) {
	tg := newTestGateway(t)
	ctx, fake := tg.ctx, tg.fake
	kv, err := bus.KV(ctx, tg.cfg.Bus, bus.KVLeases)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	w := &leaseWatchdog{ctx: ctx, since: now.Add(-time.Hour), g: tg.Service, kv: kv, active: map[string]bool{}}
	add := func(name string, expires time.Time, state api.State) *api.Sandbox {
		t.Helper()
		return tg.add(t, &api.Sandbox{Name: name, ExpiresAt: expires}, state)
	}
	expired := add("ttl/expired", now.Add(-time.Second), api.StateRunning)
	stopped := add("ttl/stopped", now.Add(-time.Minute), api.StateStopped)
	later := add("ttl/later", now.Add(time.Hour), api.StateRunning)
	never := add("ttl/never", time.Time{}, api.StateRunning)

	events := make(chan api.Event, 16)
	admin := tg.bus.Connect(t, bus.UserAdmin)
	sub, err := admin.Subscribe(api.EventSubject(expired.ID), func(m *nats.Msg) {
		var ev api.Event
		if json.Unmarshal(m.Data, &ev) == nil {
			events <- ev
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	admin.Flush()

	w.sweep(ctx, now)
	w.wg.Wait()
	exists := func(sb *api.Sandbox) bool { return tg.exists(t, sb) }
	for _, sb := range []*api.Sandbox{expired, stopped} {
		if exists(sb) {
			t.Errorf("%s is past its ttl and still exists", sb.Name)
		}
	}
	for _, sb := range []*api.Sandbox{later, never} {
		if !exists(sb) {
			t.Errorf("%s was removed before its time", sb.Name)
		}
	}
	fake.mu.Lock()
	removed := strings.Join(fake.removed, " ")
	fake.mu.Unlock()
	if !strings.Contains(removed, expired.ID) {
		t.Errorf("the vmm was not asked to remove %s's VM (removes: %s)", expired.Name, removed)
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		select {
		case ev := <-events:
			if ev.To == api.StateRemoving && strings.Contains(ev.Reason, "--ttl expired at") {
				return nil
			}
			return errors.New("not yet")
		default:
			return errors.New("no removing event with the ttl reason")
		}
	})
}

func TestParseTTL(t *testing.T) {
	for in, want := range map[string]time.Duration{"90s": 90 * time.Second, "45m": 45 * time.Minute, "2h30m": 150 * time.Minute, "7d": 7 * 24 * time.Hour} {
		if got, err := api.ParseTTL(in); err != nil || got != want {
			t.Errorf("ParseTTL(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0s", "500ms", "-1h", "367d", "1000d", "d", "1.5d", "forever", "9999999h"} {
		if _, err := api.ParseTTL(in); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseTTL(%q): %v, want invalid", in, err)
		}
	}
}
