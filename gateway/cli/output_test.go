package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/gateway"
	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// gatewayStack is a bus and a real gateway whose vmm and perimeter services are stand-ins that
// say yes to everything (a VM "runs" once started) but exec, for CLI commands that need no guest.
type gatewayStack struct {
	bus *testutil.Bus
}

func newGatewayStack(t testing.TB) *gatewayStack {
	t.Helper()
	return newGatewayStackWith(t, nil)
}

// newGatewayStackWith is newGatewayStack with seed (when not nil) run on the bus before the
// gateway starts: records written into the registry's bucket, as an earlier gateway left them.
func newGatewayStackWith(t testing.TB, seed func(*testutil.Bus)) *gatewayStack {
	t.Helper()
	b := testutil.NewBus(t)
	if seed != nil {
		seed(b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g, err := gateway.New(gateway.Config{Bus: b.Connect(t, bus.UserGateway), Home: b.Home, Host: bus.LocalHost, Log: zerolog.Nop(), Version: "0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var runErr error
	go func() { defer close(done); runErr = g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	admin := b.Connect(t, bus.UserAdmin)
	list, _ := bus.EncodeOK([]struct{}{})
	running, _ := bus.EncodeOK(map[string]any{"running": true})
	for _, subj := range []string{bus.VMMAPI.All(), bus.NetstackAPI.All(), bus.MITMAPI.All(), bus.CredAPI.All()} {
		sub, err := admin.Subscribe(subj, func(m *nats.Msg) {
			switch {
			case strings.HasSuffix(m.Subject, ".exec"):
				m.Respond(bus.EncodeError(errdefs.Unavailable("no guest here")))
			case strings.HasSuffix(m.Subject, ".list"):
				m.Respond(list)
			default:
				m.Respond(running)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
	}
	admin.Flush()
	st := &gatewayStack{bus: b}
	testutil.WaitFor(t, 10*time.Second, func() error {
		select {
		case <-done:
			t.Fatalf("gateway: %v", runErr)
		default:
		}
		_, err := st.run(t, "ps")
		return err
	})
	return st
}

// run runs one nexus command against the stack and returns its stdout.
func (st *gatewayStack) run(t testing.TB, args ...string) (string, error) {
	t.Helper()
	root := NewRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"--home", string(st.bus.Home), "--bus-url", st.bus.URL, "--log-level", "error"}, args...))
	err := root.Execute()
	return out.String(), err
}

func (st *gatewayStack) must(t testing.TB, args ...string) string {
	t.Helper()
	out, err := st.run(t, args...)
	if err != nil {
		t.Fatalf("nexus %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestJSONFlagAnywhere: --json is one persistent flag: before or after the command, the same
// bytes, the same indented JSON as always.
func TestJSONFlagAnywhere(t *testing.T) {
	st := newGatewayStack(t)
	st.must(t, "create", "box", "--image", "nexus-mini")
	before, after := st.must(t, "--json", "ps"), st.must(t, "ps", "--json")
	if before != after {
		t.Errorf("nexus --json ps and nexus ps --json differ:\n%s\n%s", before, after)
	}
	var list []api.SandboxView
	if err := json.Unmarshal([]byte(after), &list); err != nil || len(list) != 1 || list[0].Name != "default/box" {
		t.Errorf("ps --json: %s (%v)", after, err)
	}
	if !strings.HasPrefix(after, "[\n  {\n    \"id\": ") {
		t.Errorf("ps --json is not the indented JSON it was: %q", after[:min(len(after), 40)])
	}
	if human := st.must(t, "ps"); !strings.HasPrefix(human, "NAME ") {
		t.Errorf("ps without --json: %q", human)
	}
	out := st.must(t, "rm", "--force", "--json", "box")
	var res []api.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res) != 1 || res[0].Name != "default/box" {
		t.Errorf("rm --json: %s (%v)", out, err)
	}
}
