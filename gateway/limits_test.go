package gateway

import (
	"errors"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

// TestPlanEgressLimits: the create flags override the project config's egress.limits field by
// field, the result is recorded with the sandbox's egress and every later boot gets it again.
func TestPlanEgressLimits(t *testing.T) {
	none := storedSecrets(func(string) ([]string, bool) { return nil, false })
	cfg, err := config.Parse("c.yaml", []byte("version: 1\negress:\n  allow: [a.example]\n  limits:\n    max_conns: 64\n    dns_rate: 10\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := api.CreateRequest{Config: cfg, Limits: netapi.Limits{DNSRate: 1000, EgressBandwidth: 1 << 30}}
	p, err := planEgress(r, profile.Default(), time.Now(), none)
	if err != nil {
		t.Fatal(err)
	}
	want := netapi.Limits{MaxConns: 64, DNSRate: 1000, EgressBandwidth: 1 << 30}
	if p.egress.Limits != want {
		t.Fatalf("limits %+v, want %+v", p.egress.Limits, want)
	}
	again, err := planFromRecord(&api.Sandbox{Name: "p/x", Egress: p.egress})
	if err != nil || again.egress.Limits != want {
		t.Fatalf("recorded limits %+v, %v", again.egress.Limits, err)
	}
	if _, err := planEgress(api.CreateRequest{Limits: netapi.Limits{MaxConns: -1}}, profile.Default(), time.Now(), none); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("negative --max-conns: %v", err)
	}
}
