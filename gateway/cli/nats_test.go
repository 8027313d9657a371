package cli

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

// runNexusStdout runs nexus with args and returns its exit code and what it wrote to the
// process's stdout (the NATS CLI writes there, not to the command's writer).
func runNexusStdout(t *testing.T, args ...string) (int, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	root := NewRoot()
	root.SetArgs(args)
	root.SetOut(w)
	code := Execute(root)
	os.Stdout = saved
	w.Close()
	return code, <-done
}

// TestNatsPassthrough: `nexus nats …` is the NATS CLI against this home's bus (its URL file,
// whatever the port), logged in as admin, with no server, user or password to type.
func TestNatsPassthrough(t *testing.T) {
	b := testutil.NewBus(t)
	t.Setenv("NEXUS_HOME", string(b.Home))
	t.Setenv("NEXUS_BUS_PORT", "1") // the bus's url file wins: it is the running bus
	code, out := runNexusStdout(t, "nats", "account", "info")
	if code != 0 || !strings.Contains(out, "admin") || !strings.Contains(out, b.URL) {
		t.Fatalf("nexus nats account info: exit %d\n%s", code, out)
	}
	// nexus's own flags before the NATS command are nexus's.
	t.Setenv("NEXUS_HOME", t.TempDir())
	code, out = runNexusStdout(t, "--log-level", "error", "nats", "--home", string(b.Home), "--bus-url", b.URL, "account", "info")
	if code != 0 || !strings.Contains(out, "admin") {
		t.Fatalf("nexus nats --home … account info: exit %d\n%s", code, out)
	}
	t.Setenv("NEXUS_HOME", string(b.Home))
	if code, _ := runNexusStdout(t, "nats", "no-such-command"); code != 2 {
		t.Errorf("nexus nats no-such-command: exit %d, want 2", code)
	}
	root := NewRoot()
	var help bytes.Buffer
	root.SetOut(&help)
	root.SetArgs([]string{"nats", "--help"})
	if code := Execute(root); code != 0 || !strings.Contains(help.String(), "stream get") {
		t.Errorf("nexus nats --help: exit %d\n%s", code, help.String())
	}
	t.Setenv("NEXUS_HOME", t.TempDir())
	if code, _ := runNexusStdout(t, "nats", "micro", "ls"); code != 1 {
		t.Errorf("nexus nats without a stack: exit %d, want 1", code)
	}
}
