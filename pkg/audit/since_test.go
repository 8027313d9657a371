package audit_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestTailSinceByEventTime: `nexus audit --since` leaves out an event stored just now whose own
// time is older, as the events a single host's store brings into a cluster's are (bus.Migrate
// copies them with their time; their stream time is the copy's).
func TestTailSinceByEventTime(t *testing.T) {
	b := testutil.NewBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, _ := jetstream.New(b.Connect(t, bus.UserAdmin))
	now := time.Now()
	for _, ev := range []audit.Event{
		{Sandbox: "sb-1", Decision: audit.Deny, Port: 1, Time: now.Add(-48 * time.Hour)},
		{Sandbox: "sb-1", Decision: audit.Deny, Port: 2, Time: now},
	} {
		data, _ := json.Marshal(ev)
		if _, err := js.Publish(ctx, "nexus.audit.netstack.sb-1", data); err != nil {
			t.Fatal(err)
		}
	}
	var ports []int
	err := audit.Tail(ctx, b.Connect(t, bus.UserCLI), audit.TailOptions{Since: now.Add(-time.Hour)}, func(ev audit.Event) error {
		ports = append(ports, ev.Port)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 1 || ports[0] != 2 {
		t.Fatalf("--since 1h read the events of ports %v, want only the recent one (2)", ports)
	}
}
