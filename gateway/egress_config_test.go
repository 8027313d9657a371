package gateway

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
	"github.com/IniZio/nexus/pkg/profile"
)

func TestPlanEgressConfig(t *testing.T) {
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	// has stores each named secret for the hosts the config binds it to.
	has := func(names ...string) storedSecrets {
		return func(n string) ([]string, bool) {
			return []string{"api.github.com", "api.example.com"}, slices.Contains(names, n)
		}
	}
	cfg, err := config.Parse("c.yaml", []byte(`version: 1
egress:
  allow: [registry.npmjs.org]
  policy:
    api.github.com:
      paths: [GET /user]
    api.example.com:
      paths: [GET /v1/**]
  secrets:
    - {name: GH_TOKEN, hosts: [api.github.com]}
    - {name: EX, hosts: [api.example.com], env: EX_TOKEN}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := planEgress(api.CreateRequest{Repos: []string{"acme/app"}, Config: cfg}, profile.Default(), now, has("GH_TOKEN", "EX"))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"registry.npmjs.org", "api.github.com", "api.example.com", "github.com"} {
		if !slices.Contains(p.hosts, h) {
			t.Errorf("allowlist %v lacks %s", p.hosts, h)
		}
	}
	if p.egress.Mode != api.EgressCurated || p.config != cfg {
		t.Fatalf("plan %+v", p)
	}
	// --repo's GH_TOKEN and the config's are one binding.
	var names []string
	for _, s := range p.secrets {
		names = append(names, s.Name)
		if s.Name == "EX" && (s.Env != "EX_TOKEN" || !slices.Equal(s.Hosts, []string{"api.example.com"})) {
			t.Errorf("EX binding %+v", s)
		}
	}
	if strings.Join(names, ",") != "GH_TOKEN,EX" {
		t.Fatalf("bindings %v", names)
	}
	// The sandbox's request policy is the repos plus the config's egress.policy.
	sb := &api.Sandbox{Egress: p.egress, Config: p.config}
	pol := requestPolicy(sb)
	if !slices.Equal(pol.Repos, []string{"acme/app"}) || len(pol.Hosts) != 2 {
		t.Fatalf("request policy %+v", pol)
	}
	if _, err := httppolicy.New(pol); err != nil {
		t.Fatal(err)
	}

	if _, err := planEgress(api.CreateRequest{Config: cfg}, profile.Default(), now, has("GH_TOKEN")); !errors.Is(err, errdefs.ErrInvalid) ||
		!strings.Contains(err.Error(), "no secret named EX") {
		t.Fatalf("missing secret: %v", err)
	}
	bad := &config.Config{Version: 1, Egress: config.Egress{Allow: []string{"api.example.com"},
		Policy: []httppolicy.HostRules{{Host: "api.example.com", Paths: []string{"GET /"}}}}}
	if _, err := planEgress(api.CreateRequest{Config: bad}, profile.Default(), now, has()); err == nil || err.Error() != config.ConflictError("api.example.com").Error() {
		t.Fatalf("conflict: %v", err)
	}
}
