package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// TestHostLossMidTransition: on a host that is lost (its heartbeat expired, nothing of it
// answers), a boot under way ends at once with "host b lost" and the sandbox is failed so; a
// stopping sandbox is failed "host b lost while the sandbox was stopping"; one being removed,
// and one removed with `nexus rm` meanwhile, are gone from the registry at once, without
// waiting on the host. When b is back, the booted VM that runs there is adopted, the stop is
// finished (stopped), and b removes the VMs of both removed sandboxes.
func TestHostLossMidTransition(t *testing.T) {
	tg := newTestGateway(t)
	beat, check := tg.hostBeats(t)
	pending := func() int {
		for _, h := range tg.hostStates(tg.ctx) {
			if h.Host == "b" {
				return h.PendingRemovals
			}
		}
		t.Fatal("no heartbeat of b")
		return 0
	}
	beat("b", time.Now())

	booting := tg.add(t, &api.Sandbox{Name: "default/booting", Host: "b", Agent: "codex", Egress: api.Egress{Mode: api.EgressNone}}, api.StateCreated)
	stopping := tg.add(t, &api.Sandbox{Name: "default/stopping", Host: "b"}, api.StateStopping)
	removing := tg.add(t, &api.Sandbox{Name: "default/removing", Host: "b"}, api.StateRunning)
	if err := tg.reg.Transition(tg.ctx, removing, api.StateRemoving, "", nil); err != nil {
		t.Fatal(err)
	}
	failed := tg.add(t, &api.Sandbox{Name: "default/failed", Host: "b"}, api.StateRunning)

	// A boot whose VM start b never answers.
	tg.fake.silence(vmmapi.Start.Subject("b"))
	booted := make(chan error, 1)
	go func() { booted <- tg.boot(tg.ctx, booting, "") }()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if len(tg.fake.called(vmmapi.Start.Subject("b"))) == 0 {
			select {
			case err := <-booted:
				t.Fatalf("the boot ended before it asked b's vmm: %v", err)
			default:
			}
			return errors.New("the boot has not asked b's vmm yet")
		}
		return nil
	})

	// b is lost: nothing of it answers any more.
	tg.fake.silence("nexus.vmm.b.", "nexus.netstack.b.", "nexus.mitm.b.")
	beat("b", time.Now().Add(-bus.HostTTL-time.Second))
	check()
	select {
	case err := <-booted:
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "host b lost while sandbox default/booting was starting") {
			t.Errorf("the boot on lost host b ended with %v; want host b lost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the boot on lost host b did not end")
	}
	for sb, want := range map[*api.Sandbox]string{booting: "host b lost", stopping: "host b lost while the sandbox was stopping"} {
		if cur := tg.get(t, sb); cur.State != api.StateFailed || cur.Reason != want {
			t.Errorf("%s on lost host b: %s (%q); want failed (%q)", sb.Name, cur.State, cur.Reason, want)
		}
	}
	if tg.exists(t, removing) {
		t.Errorf("%s, being removed when b was lost, is still recorded: %s", removing.Name, tg.get(t, removing).State)
	}
	// nexus rm of a sandbox on the lost host: its record goes now.
	failedNow := tg.get(t, failed)
	if failedNow.State != api.StateFailed || failedNow.Reason != "host b lost" {
		t.Fatalf("%s: %s (%q); want failed (host b lost)", failed.Name, failedNow.State, failedNow.Reason)
	}
	res, err := tg.apply(tg.remove)(tg.ctx, api.NamesRequest{Names: []string{failed.Name}})
	if err != nil || len(res) != 1 || res[0].Error != "" {
		t.Fatalf("nexus rm %s on lost host b: %+v, %v", failed.Name, res, err)
	}
	if tg.exists(t, failed) {
		t.Errorf("%s is still recorded after nexus rm", failed.Name)
	}
	if n := pending(); n != 2 {
		t.Errorf("nexus hosts: b owes %d removals; want 2", n)
	}
	if got := tg.fake.called(vmmapi.Remove.Subject("b")); len(got) != 0 {
		t.Errorf("lost host b was asked to remove: %v", got)
	}

	// b is back; the booted VM runs there.
	tg.fake.silence()
	tg.fake.mu.Lock()
	tg.fake.running = map[string]bool{booting.ID: true}
	tg.fake.mu.Unlock()
	beat("b", time.Now())
	check()
	if cur := tg.get(t, booting); cur.State != api.StateRunning {
		t.Errorf("%s after b is back with its VM running: %s (%q); want running", booting.Name, cur.State, cur.Reason)
	}
	if cur := tg.get(t, stopping); cur.State != api.StateStopped || len(tg.fake.called(vmmapi.Stop.Subject("b"))) == 0 {
		t.Errorf("%s after b is back: %s (%q), b asked to stop it: %v; want stopped", stopping.Name, cur.State, cur.Reason, tg.fake.called(vmmapi.Stop.Subject("b")))
	}
	removed := strings.Join(tg.fake.called(vmmapi.Remove.Subject("b")), "\n")
	for _, sb := range []*api.Sandbox{removing, failed} {
		if !strings.Contains(removed, sb.ID) {
			t.Errorf("b, back, was not asked to remove the VM of %s (%s); asked: %q", sb.Name, sb.ID, removed)
		}
	}
	if n := pending(); n != 0 {
		t.Errorf("b still owes %d removals once back", n)
	}
}
