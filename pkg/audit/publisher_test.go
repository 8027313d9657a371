package audit_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

func TestPublisherStoresEveryEvent(t *testing.T) {
	b := testutil.NewBus(t)
	p, err := audit.NewPublisher(b.Connect(t, bus.UserNetstack), bus.UserNetstack, zerolog.Nop(), audit.WithLimits(audit.Unlimited))
	if err != nil {
		t.Fatal(err)
	}
	const n = 5000
	for i := range n {
		p.Emit(context.Background(), audit.Event{Sandbox: "sb-1", Layer: audit.LayerL4, Decision: audit.Deny, Port: i})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(b.Connect(t, bus.UserAdmin))
	st, err := js.Stream(ctx, bus.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := st.Info(ctx)
	if info.State.Msgs != n {
		t.Fatalf("stream holds %d events, want %d", info.State.Msgs, n)
	}
	msg, err := st.GetLastMsgForSubject(ctx, "nexus.audit.netstack.sb-1")
	if err != nil {
		t.Fatal(err)
	}
	var ev audit.Event
	json.Unmarshal(msg.Data, &ev)
	if ev.Port != n-1 || ev.Time.IsZero() {
		t.Fatalf("last event %+v", ev)
	}
}
