package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

// runNexusStdout runs nexus with args in a child process (the test binary, see
// TestNatsChild) and returns its exit code and what it wrote to stdout. The NATS CLI keeps its
// options in package variables that its connections' callbacks read, so two runs in one
// process race; `nexus nats` runs once per process, and so does each run here.
func runNexusStdout(t *testing.T, args ...string) (int, string) {
	t.Helper()
	enc, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNatsChild$")
	cmd.Env = append(os.Environ(), natsChildArgs+"="+string(enc))
	var out bytes.Buffer
	cmd.Stdin = os.Stdin // as the caller left it (a test may have swapped it)
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String()
	case err != nil:
		t.Fatal(err)
	}
	return 0, out.String()
}

// natsChildArgs carries a child's nexus arguments (JSON) to TestNatsChild.
const natsChildArgs = "NEXUS_TEST_NATS_CHILD_ARGS"

// TestNatsChild is the child process of runNexusStdout: it runs nexus once and exits with its
// status. Without the variable it does nothing.
func TestNatsChild(t *testing.T) {
	enc := os.Getenv(natsChildArgs)
	if enc == "" {
		return
	}
	var args []string
	if err := json.Unmarshal([]byte(enc), &args); err != nil {
		t.Fatal(err)
	}
	root := NewRoot()
	root.SetArgs(args)
	os.Exit(Execute(root))
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
	if code, help := runNexusStdout(t, "nats", "--help"); code != 0 || !strings.Contains(help, "stream get") {
		t.Errorf("nexus nats --help: exit %d\n%s", code, help)
	}
	t.Setenv("NEXUS_HOME", t.TempDir())
	if code, _ := runNexusStdout(t, "nats", "micro", "ls"); code != 1 {
		t.Errorf("nexus nats without a stack: exit %d, want 1", code)
	}
}

// TestNatsOnClusterNode: on a cluster node, whose bus speaks only TLS signed by the cluster's
// CA (on loopback too), `nexus nats …` trusts that CA as every other client of the home does.
func TestNatsOnClusterNode(t *testing.T) {
	h := home.Dir(testutil.IsolateHome(t))
	port := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}
	if _, err := bus.Init(bus.InitConfig{Home: h, Name: "t", Host: "a", Advertise: "127.0.0.1", Listen: "127.0.0.1",
		ClientPort: port(), RoutePort: port()}); err != nil {
		t.Fatal(err)
	}
	s, err := bus.StartServer(context.Background(), bus.ServerConfig{Home: h, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	nc, err := bus.Connect(context.Background(), bus.ConnectConfig{Home: h, User: bus.UserAdmin, URL: s.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("nexus.test.echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("echo "), m.Data...)) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	code, out := runNexusStdout(t, "nats", "req", "nexus.test.echo", "over-tls", "--raw")
	if code != 0 || strings.TrimSpace(out) != "echo over-tls" {
		t.Fatalf("nexus nats req on a cluster node: exit %d\n%s", code, out)
	}
}
