package gateway

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// TestMetrics scrapes /metrics from a gateway on a real bus: the registry's sandboxes by state
// and each running sandbox's figures, under the documented names.
func TestMetrics(t *testing.T) {
	tg := newTestGateway(t)
	ctx, g := tg.ctx, tg.Service
	tg.add(t, &api.Sandbox{Name: "m/one", MemoryMiB: 256}, api.StateRunning)
	tg.add(t, &api.Sandbox{Name: "m/two", MemoryMiB: 256}, api.StateCreated)
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
