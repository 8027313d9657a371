package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestMetrics scrapes /metrics from a gateway on a real bus: the registry's sandboxes by state
// and each running sandbox's figures, under the documented names.
func TestMetrics(t *testing.T) {
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserGateway)
	startFakeServices(t, b.Connect(t, bus.UserAdmin))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg, err := NewRegistry(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	g := &Service{cfg: Config{Bus: nc, Home: b.Home, Host: bus.LocalHost}, reg: reg, log: zerolog.Nop()}
	for _, name := range []string{"m/one", "m/two"} {
		sb := &api.Sandbox{Name: name, Image: "nexus-mini", Host: bus.LocalHost, MemoryMiB: 256}
		if err := reg.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if name == "m/one" {
			for _, s := range []api.State{api.StateStarting, api.StateRunning} {
				if err := reg.Transition(ctx, sb, s, "", nil); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.serveMetrics(ctx, ln)
	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`nexus_sandboxes{state="running"} 1`,
		`nexus_sandboxes{state="created"} 1`,
		`nexus_sandbox_memory_bytes{id=`,
		`kind="guest",sandbox="m/one"} 2.68435456e+08`,
		`nexus_sandbox_cpu_seconds_total{`,
		`nexus_sandbox_network_bytes_total{`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(string(body), `sandbox="m/two"`) {
		t.Errorf("a sandbox that is not running has figures:\n%s", body)
	}
}
