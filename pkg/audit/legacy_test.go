package audit_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestLegacySpoolIsRepublishedUnderTheService: an event an older build spooled on
// nexus.audit.egress.<sandbox> (where no service may publish any more) is published under the
// service's own subject after the upgrade.
func TestLegacySpoolIsRepublishedUnderTheService(t *testing.T) {
	b := testutil.NewBus(t)
	path := filepath.Join(t.TempDir(), "netstack.spool")
	old := `{"id":"legacy-1","subject":"nexus.audit.egress.sb-old","data":{"time":"2026-11-30T10:00:00Z","sandbox":"sb-old","layer":"dns","decision":"deny","host":"old.example"}}` + "\n"
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := audit.NewSpooledPublisher(b.Connect(t, bus.UserNetstack), bus.UserNetstack, zerolog.Nop(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, _ := jetstream.New(b.Connect(t, bus.UserAdmin))
	st, err := js.Stream(ctx, bus.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		_, err := st.GetLastMsgForSubject(ctx, audit.Subject(bus.UserNetstack, "sb-old"))
		return err
	})
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readSandbox(t, b, "sb-old"); len(got) != 1 || got[0].Host != "old.example" {
		t.Fatalf("after the upgrade: %+v", got)
	}
}
