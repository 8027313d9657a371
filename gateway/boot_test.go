package gateway

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestBootRemovedMeanwhile: a sandbox removed (rm --force) while its VM is starting makes the
// create fail with that reason, not with the revision race it loses.
func TestBootRemovedMeanwhile(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserGateway)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ok, _ := bus.EncodeOK(struct{}{})
	admin := b.Connect(t, bus.UserAdmin)
	sub, err := admin.Subscribe(bus.VMMAPI.All(), func(m *nats.Msg) {
		if m.Subject == vmmapi.Start.Subject(bus.LocalHost) {
			once.Do(func() { close(started) })
			<-release
		}
		m.Respond(ok)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	// The fake vmm answers only once the server has its subscription.
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := NewRegistry(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	g := &Service{cfg: Config{Bus: nc, Home: b.Home, Host: bus.LocalHost}, reg: reg, log: zerolog.Nop()}
	sb := &api.Sandbox{Name: "default/racy", Image: "nexus-mini", Host: bus.LocalHost, Agent: "claude-code",
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
	cur, err := reg.Get(ctx, sb.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Transition(ctx, cur, api.StateRemoving, "", nil); err != nil {
		t.Fatal(err)
	}
	if err := reg.Delete(ctx, cur); err != nil {
		t.Fatal(err)
	}
	close(release)
	err = <-errc
	if err == nil || !strings.Contains(err.Error(), "sandbox default/racy was removed while it was starting") {
		t.Fatalf("boot: %v", err)
	}
}
