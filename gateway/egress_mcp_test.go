package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// TestMCPEgressGate: live changes over MCP are refused while --mcp-egress is off; on, an MCP
// grant still never opens a private address (even one --allow-private names) nor a host a
// secret is bound to, stored or bound to the sandbox, wildcards included. The CLI may.
func TestMCPEgressGate(t *testing.T) {
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserGateway)
	admin := b.Connect(t, bus.UserAdmin)
	startLivePerimeter(t, admin)
	list, _ := bus.EncodeOK(credapi.SecretListResponse{Secrets: []credapi.SecretInfo{{Name: "NPM_TOKEN", Hosts: []string{"registry.npmjs.org"}}}})
	sub, err := admin.Subscribe(credapi.SecretList.Subject(""), func(m *nats.Msg) { m.Respond(list) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	admin.Flush()
	ctx := context.Background()
	reg, err := NewRegistry(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	g := &Service{cfg: Config{Bus: nc, Home: b.Home, Host: bus.LocalHost}, reg: reg, log: zerolog.Nop(), grantWake: make(chan struct{}, 1)}
	sb := &api.Sandbox{Name: "default/orch", Image: "nexus-mini", Host: bus.LocalHost, Secrets: []api.SecretBinding{{Name: "GH_TOKEN", Hosts: []string{"api.github.com"}}},
		Egress: api.Egress{Mode: api.EgressCurated, Allow: []string{"api.anthropic.com:443,80"}, AllowPrivate: []string{"10.9.0.0/16"}}}
	if err := reg.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	mcp := func(host string) api.EgressChangeRequest {
		return api.EgressChangeRequest{Name: sb.Name, Host: host, Via: ViaMCP}
	}

	for _, call := range []func(context.Context, api.EgressChangeRequest) (api.EgressChange, error){g.egressAllow, g.egressRevoke, g.egressDeny} {
		if _, err := call(ctx, mcp("docs.example.com")); !errors.Is(err, errdefs.ErrRefused) || !strings.Contains(err.Error(), "--mcp-egress") {
			t.Fatalf("over MCP with the switch off: %v", err)
		}
	}
	g.cfg.MCPEgress = true
	if _, err := g.egressAllow(ctx, mcp("docs.example.com")); err != nil {
		t.Fatalf("a public host over MCP: %v", err)
	}
	if _, err := g.egressRevoke(ctx, mcp("docs.example.com")); err != nil {
		t.Fatalf("revoke over MCP: %v", err)
	}
	for host, want := range map[string]string{
		"10.9.1.1:5432":      "private address",
		"api.github.com":     "secret GH_TOKEN",
		"*.github.com":       "secret GH_TOKEN",
		"registry.npmjs.org": "secret NPM_TOKEN",
		"*.npmjs.org":        "secret NPM_TOKEN",
	} {
		if _, err := g.egressAllow(ctx, mcp(host)); !errors.Is(err, errdefs.ErrRefused) || !strings.Contains(err.Error(), want) {
			t.Errorf("MCP grant of %s: %v, want refused naming %q", host, err, want)
		}
	}
	if _, err := g.egressAllow(ctx, api.EgressChangeRequest{Name: sb.Name, Host: "10.9.1.1:5432", Via: "cli"}); err != nil {
		t.Errorf("the operator's grant inside --allow-private: %v", err)
	}
	if _, err := g.egressApply(ctx, api.EgressApplyRequest{Name: sb.Name, Via: ViaMCP}); !errors.Is(err, errdefs.ErrRefused) {
		t.Errorf("apply over MCP: %v", err)
	}
}

func TestPatternsOverlap(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"api.github.com", "api.github.com", true},
		{"*.github.com", "api.github.com", true},
		{"api.github.com", "*.github.com", true},
		{"*.github.com", "*.api.github.com", true},
		{"*.github.com", "github.com", false},
		{"*.example.com", "*.github.com", false},
		{"docs.example.com", "api.github.com", false},
	} {
		if got := patternsOverlap(c.a, c.b); got != c.want {
			t.Errorf("patternsOverlap(%s, %s) = %v", c.a, c.b, got)
		}
	}
}
