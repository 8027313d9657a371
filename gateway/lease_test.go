package gateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
)

func TestDueForLeaseCheck(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, tc := range []struct {
		state   api.State
		started time.Time
		updated time.Time
		want    bool
	}{
		{api.StateRunning, ago(LeaseGrace + time.Second), ago(time.Second), true},
		{api.StateRunning, ago(LeaseGrace - time.Second), ago(time.Hour), false}, // grace counts from running
		{api.StatePaused, ago(time.Hour), ago(time.Second), true},
		{api.StateFailed, time.Time{}, ago(LeaseGrace), true},
		{api.StateFailed, time.Time{}, ago(time.Second), false},
		{api.StateStarting, time.Time{}, ago(time.Minute), false}, // a boot is under way
		{api.StateStarting, time.Time{}, ago(LeaseStuckBoot), true},
		{api.StateRemoving, time.Time{}, ago(time.Second), false},
		{api.StateRemoving, time.Time{}, ago(LeaseStuckRemove), true},
	} {
		sb := &api.Sandbox{State: tc.state, StartedAt: tc.started, UpdatedAt: tc.updated}
		if got := dueForLeaseCheck(sb, now); got != tc.want {
			t.Errorf("%s started %v updated %v: due = %v, want %v", tc.state, now.Sub(tc.started), now.Sub(tc.updated), got, tc.want)
		}
	}
}

// TestLeaseSweep runs the sweep against a real bus: the registry and nexus_leases (with its
// real TTL) decide, and a lease is held by the CLI's bus user through the client API.
func TestLeaseSweep(t *testing.T) {
	tg := newTestGateway(t)
	ctx, reg := tg.ctx, tg.reg
	kv, err := bus.KV(ctx, tg.cfg.Bus, bus.KVLeases)
	if err != nil {
		t.Fatal(err)
	}
	w := &leaseWatchdog{ctx: ctx, since: time.Now(), g: tg.Service, kv: kv, active: map[string]bool{}}

	start := time.Now()
	add := func(name string, ephemeral bool, state api.State, startedAgo time.Duration) *api.Sandbox {
		t.Helper()
		reg.now = func() time.Time { return start.Add(-startedAgo) }
		return tg.add(t, &api.Sandbox{Name: name, Ephemeral: ephemeral}, state)
	}
	lapsed := add("launch/lapsed", true, api.StateRunning, time.Minute)
	held := add("launch/held", true, api.StateRunning, time.Minute)
	young := add("launch/young", true, api.StateRunning, time.Second)
	booting := add("launch/booting", true, api.StateStarting, time.Minute)
	kept := add("default/kept", false, api.StateRunning, time.Hour)
	reg.now = time.Now

	cli := api.NewClient(tg.bus.Connect(t, bus.UserCLI))
	lease, err := cli.HoldLease(ctx, held.ID)
	if err != nil {
		t.Fatalf("the CLI user cannot hold a lease: %v", err)
	}
	exists := func(sb *api.Sandbox) bool { return tg.exists(t, sb) }
	sweep := func() {
		w.sweep(ctx, start)
		w.wg.Wait()
	}
	// A watchdog that just started removes nothing (callers may be reconnecting).
	sweep()
	if !exists(lapsed) {
		t.Fatalf("%s was removed within LeaseGrace of the watchdog's start", lapsed.Name)
	}
	w.since = start.Add(-LeaseGrace)
	sweep()
	if exists(lapsed) {
		t.Errorf("%s has no lease and is past its grace: it should be removed", lapsed.Name)
	}
	for _, sb := range []*api.Sandbox{held, young, booting, kept} {
		if !exists(sb) {
			t.Errorf("%s was removed", sb.Name)
		}
	}
	// The holder stops refreshing (as if killed): the key lapses after the bucket TTL and the
	// next sweep removes the sandbox.
	lease.Stop()
	stopped := time.Now()
	testutil.WaitFor(t, bus.LeaseTTL+5*time.Second, func() error {
		sweep()
		if exists(held) {
			return fmt.Errorf("%s still exists", held.Name)
		}
		return nil
	})
	if d := time.Since(stopped); d < bus.LeaseTTL-time.Second {
		t.Errorf("removed %v after the last refresh; the lease TTL is %v", d, bus.LeaseTTL)
	}
	for _, sb := range []*api.Sandbox{young, booting, kept} {
		if !exists(sb) {
			t.Errorf("%s was removed", sb.Name)
		}
	}
}
