package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

func newTestRegistry(t *testing.T) (*Registry, *nats.Conn) {
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserGateway)
	r, err := NewRegistry(context.Background(), nc)
	if err != nil {
		t.Fatal(err)
	}
	return r, nc
}

func TestRegistryLifecycle(t *testing.T) {
	r, nc := newTestRegistry(t)
	ctx := context.Background()
	events := make(chan api.Event, 16)
	sub, err := nc.Subscribe("nexus.events.sandbox.>", func(m *nats.Msg) {
		var ev api.Event
		json.Unmarshal(m.Data, &ev)
		events <- ev
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	sb := &api.Sandbox{Name: "proj/task-42", Image: "nexus-mini", Labels: map[string]string{"task-id": "42"}}
	if err := r.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := r.Create(ctx, &api.Sandbox{Name: "proj/task-42"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate: got %v, want conflict", err)
	}
	if err := r.Create(ctx, &api.Sandbox{Name: "proj/other", Labels: map[string]string{"task-id": "7"}}); err != nil {
		t.Fatal(err)
	}
	sel, _ := api.ParseSelector("task-id=42")
	list, err := r.List(ctx, sel)
	if err != nil || len(list) != 1 || list[0].Name != "proj/task-42" {
		t.Fatalf("selector list: %v %v", list, err)
	}
	all, _ := r.List(ctx, nil)
	if len(all) != 2 {
		t.Fatalf("list all: %d", len(all))
	}

	// Two readers of the same revision: the second writer loses.
	a, _ := r.Get(ctx, "proj/task-42")
	b, _ := r.Get(ctx, "proj/task-42")
	a.Labels["x"] = "1"
	if err := r.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	b.Labels["x"] = "2"
	if err := r.Update(ctx, b); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("concurrent update: got %v, want conflict", err)
	}

	// The state machine.
	if err := r.Transition(ctx, a, api.StateRunning, "", nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("created → running: got %v, want conflict", err)
	}
	for _, to := range []api.State{api.StateStarting, api.StateRunning, api.StatePaused, api.StateRunning, api.StateStopping, api.StateStopped} {
		if err := r.Transition(ctx, a, to, "", nil); err != nil {
			t.Fatalf("→ %s: %v", to, err)
		}
	}
	got, _ := r.Get(ctx, "proj/task-42")
	if got.State != api.StateStopped || got.StartedAt.IsZero() {
		t.Fatalf("after transitions: %+v", got)
	}
	if err := r.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(ctx, "proj/task-42"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}

	want := []api.State{api.StateCreated, api.StateCreated, api.StateStarting, api.StateRunning, api.StatePaused, api.StateRunning, api.StateStopping, api.StateStopped, ""}
	for i, w := range want {
		select {
		case ev := <-events:
			if ev.To != w {
				t.Fatalf("event %d: to %q, want %q", i, ev.To, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d (%s) not published", i, w)
		}
	}
}

func TestParseName(t *testing.T) {
	for in, want := range map[string]string{"task": "default/task", "myproject/task-42": "myproject/task-42"} {
		got, err := api.ParseName(in)
		if err != nil || got != want {
			t.Errorf("ParseName(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "a/b/c", "UP", "-x", "a/", "a b", "x.y", string(make([]byte, 70))} {
		if _, err := api.ParseName(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseName(%q): got %v, want invalid", bad, err)
		}
	}
}
