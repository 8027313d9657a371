package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestBootEndsWhenItsVMFails: a vmm killed mid-boot never answers the start it took; when the
// restarted vmm reports that VM failed, the boot ends at once with the reason and the sandbox is
// failed, instead of waiting out the call's deadline.
func TestBootEndsWhenItsVMFails(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserGateway)
	ok, _ := bus.EncodeOK(struct{}{})
	admin := b.Connect(t, bus.UserAdmin)
	started := make(chan struct{}, 1)
	sub, err := admin.Subscribe(bus.VMMAPI.All(), func(m *nats.Msg) {
		if m.Subject == vmmapi.Start.Subject(bus.LocalHost) {
			started <- struct{}{}
			return // the vmm that took it died: no answer ever comes
		}
		m.Respond(ok)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg, err := NewRegistry(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	g := &Service{cfg: Config{Bus: nc, Home: b.Home, Host: bus.LocalHost}, reg: reg, log: zerolog.Nop()}
	vms, err := g.watchVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer vms.Unsubscribe()
	sb := &api.Sandbox{ID: NewID(), Name: "default/lost", Image: "nexus-mini", Host: bus.LocalHost, Agent: "claude-code",
		Egress: api.Egress{Mode: api.EgressNone}}
	if err := reg.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- g.boot(ctx, sb, "") }()
	select {
	case <-started:
	case err := <-errc:
		t.Fatalf("boot ended before the VM start: %v", err)
	}
	const reason = "nexus restarted while the VM was booting, before its guest was configured; the VM was stopped: start it again"
	ev, _ := json.Marshal(vmmapi.VMEvent{ID: sb.ID, Failed: reason, Time: time.Now().UTC()})
	if err := admin.Publish(vmmapi.VMEventSubject(sb.ID), ev); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), reason) {
			t.Fatalf("boot: %v, want the VM's failure %q", err, reason)
		}
	case <-time.After(time.Minute):
		t.Fatal("the boot still waits for the vmm that died a minute after its VM was reported failed")
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		cur, err := reg.Get(ctx, sb.Name)
		if err != nil {
			return err
		}
		if cur.State != api.StateFailed || !strings.Contains(cur.Reason, reason) {
			return fmt.Errorf("the sandbox is %s (%s)", cur.State, cur.Reason)
		}
		return nil
	})
}
