package audit_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// streamPorts lists the Port of every event in the audit stream.
func streamPorts(t *testing.T, b *testutil.Bus) []int {
	t.Helper()
	var ports []int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := audit.Tail(ctx, b.Connect(t, bus.UserAdmin), audit.TailOptions{}, func(ev audit.Event) error {
		ports = append(ports, ev.Port)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Ints(ports)
	return ports
}

// TestSpoolSurvivesACrash: events a publisher could not get acknowledged (here: its bus
// connection is gone) are published by the next publisher on the same spool, each exactly once,
// and what was acknowledged is not sent again.
func TestSpoolSurvivesACrash(t *testing.T) {
	b := testutil.NewBus(t)
	path := filepath.Join(t.TempDir(), "audit", "netstack.spool")

	// A first run: two events acknowledged, then the connection dies and three more are emitted.
	nc := b.Connect(t, bus.UserNetstack)
	p1, err := audit.NewSpooledPublisher(nc, bus.UserNetstack, zerolog.Nop(), path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		p1.Emit(context.Background(), audit.Event{Sandbox: "sb-1", Layer: audit.LayerL4, Port: i})
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := len(streamPorts(t, b)); got != 2 {
			return errNot(got)
		}
		return nil
	})
	nc.Close()
	// Event 3 alone first: its publish fails and retries. Events 4 and 5 must reach the spool
	// all the same (a retrying publish once held every later event in memory only).
	p1.Emit(context.Background(), audit.Event{Sandbox: "sb-1", Layer: audit.LayerL4, Port: 3})
	testutil.WaitFor(t, 10*time.Second, func() error {
		b, _ := os.ReadFile(path)
		if n := countEvents(b); n < 3 {
			return errNot(n)
		}
		return nil
	})
	for i := 4; i <= 5; i++ {
		p1.Emit(context.Background(), audit.Event{Sandbox: "sb-1", Layer: audit.LayerL4, Port: i})
	}
	// The process dies here: p1 is never closed. Its spool lock goes with its file.
	// All five events are in the spool (acknowledgements are lines of their own, so counting
	// lines is not enough: it let the "crash" happen before events 4 and 5 were written).
	testutil.WaitFor(t, 10*time.Second, func() error {
		b, _ := os.ReadFile(path)
		if n := countEvents(b); n < 5 {
			return errNot(n)
		}
		return nil
	})
	if _, err := audit.NewSpooledPublisher(b.Connect(t, bus.UserNetstack), bus.UserNetstack, zerolog.Nop(), path); err == nil {
		t.Fatal("a second publisher took a spool that is in use")
	}
	p1.ReleaseSpoolForTest()

	p2, err := audit.NewSpooledPublisher(b.Connect(t, bus.UserNetstack), bus.UserNetstack, zerolog.Nop(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testutil.WaitFor(t, 20*time.Second, func() error {
		if got := len(streamPorts(t, b)); got != 5 {
			return errNot(got)
		}
		return nil
	})
	if err := p2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := streamPorts(t, b); len(got) != 5 || got[0] != 1 || got[4] != 5 {
		t.Fatalf("stream after the restart: ports %v, want 1..5 once each", got)
	}
	// Everything is acknowledged now: a third run publishes nothing again.
	p3, err := audit.NewSpooledPublisher(b.Connect(t, bus.UserNetstack), bus.UserNetstack, zerolog.Nop(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := p3.Close(ctx); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(b.Connect(t, bus.UserAdmin))
	st, _ := js.Stream(ctx, bus.StreamAudit)
	info, _ := st.Info(ctx)
	if info.State.Msgs != 5 {
		t.Fatalf("stream holds %d events after a clean restart, want 5", info.State.Msgs)
	}
}

func errNot(n int) error { return fmt.Errorf("have %d", n) }

// countEvents counts the spool's event records (not its acknowledgements).
func countEvents(b []byte) int {
	n := 0
	for _, line := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(line, []byte(`"id":`)) {
			n++
		}
	}
	return n
}
