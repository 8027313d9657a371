package bus_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestStaleURLIgnored: the URL a killed bus left behind is not dialled (another stack may own
// its port by now); with the bus down a client looks at its own port (NEXUS_BUS_PORT), and the
// error names it. A running bus's URL is still found.
func TestStaleURLIgnored(t *testing.T) {
	b := testutil.NewBus(t)
	if got, _ := bus.ReadURL(b.Home, 5999); got != b.URL {
		t.Fatalf("running bus: ReadURL %q, want %q", got, b.URL)
	}
	dir := testutil.IsolateHome(t)
	stale, err := testutil.StartBus(dir)
	if err != nil {
		t.Fatal(err)
	}
	stale.Server.Shutdown()
	// What a bus killed by SIGKILL leaves: its url file, naming a port it no longer holds.
	if err := os.WriteFile(filepath.Join(stale.Home.Bus(), "url"), []byte(stale.URL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := bus.ReadURL(stale.Home, 5999); got != "nats://127.0.0.1:5999" {
		t.Errorf("stale url file: ReadURL %q, want port 5999", got)
	}
	_, err = bus.Connect(t.Context(), bus.ConnectConfig{Home: stale.Home, User: bus.UserCLI, Port: 5999})
	if err == nil || !strings.Contains(err.Error(), "no bus at nats://127.0.0.1:5999") {
		t.Errorf("connect with the bus down: %v", err)
	}
}
