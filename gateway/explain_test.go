package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
)

func TestExplain(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := &config.Config{Version: 1, Egress: config.Egress{
		Allow:  []string{"registry.npmjs.org"},
		Policy: []httppolicy.HostRules{{Host: "api.example.com", Paths: []string{"GET /v1/**"}}},
	}}
	curated := &api.Sandbox{Name: "default/a", Config: cfg, Egress: api.Egress{Mode: api.EgressCurated, Repos: []string{"acme/app"},
		Allow: []string{"github.com:443,80", "api.github.com:443,80", "registry.npmjs.org:443,80", "api.example.com:443,80"}},
		Secrets: []api.SecretBinding{{Name: "GH_TOKEN", Hosts: []string{"api.github.com", "github.com"}}}}
	for _, tc := range []struct {
		name                  string
		sb                    *api.Sandbox
		method, url, body     string
		decision, layer, rule string
		cred                  string
		reason                string
	}{
		{name: "none", sb: &api.Sandbox{Name: "default/n", Egress: api.Egress{Mode: api.EgressNone}}, method: "GET", url: "https://x.com/",
			decision: "deny", layer: "mode", rule: "egress_none"},
		{name: "allow-all active", sb: &api.Sandbox{Name: "default/b", Egress: api.Egress{Mode: api.EgressAllowAll, AllowAllUntil: now.Add(time.Hour)}}, method: "GET", url: "https://x.com/",
			decision: "allow", layer: "mode", rule: "allow_all"},
		{name: "allow-all expired", sb: &api.Sandbox{Name: "default/b", Egress: api.Egress{Mode: api.EgressAllowAll, AllowAllUntil: now.Add(-time.Hour)}}, method: "GET", url: "https://x.com/",
			decision: "deny", layer: "mode", rule: "allow_all_expired"},
		{name: "host not allowed", sb: curated, method: "GET", url: "https://evil.com/", decision: "deny", layer: "host", rule: "host_not_allowed",
			reason: "nexus: refused: host evil.com is not in this sandbox's allowlist (add it with --allow-host evil.com or egress.allow in .nexus/config.yaml)"},
		{name: "port not allowed", sb: curated, method: "GET", url: "https://github.com:8443/", decision: "deny", layer: "host", rule: "host_not_allowed"},
		{name: "open host", sb: curated, method: "PUT", url: "https://registry.npmjs.org/pkg", decision: "allow", layer: "request", rule: httppolicy.RuleOpenHost},
		{name: "foreign clone", sb: curated, method: "GET", url: "https://github.com/evil/x.git/info/refs?service=git-upload-pack", decision: "deny", layer: "request", rule: httppolicy.RuleForeignRepo},
		{name: "bound clone swaps", sb: curated, method: "get", url: "https://github.com/acme/app.git/info/refs?service=git-upload-pack", decision: "allow", layer: "request", rule: httppolicy.RuleSmartHTTP, cred: "swapped GH_TOKEN"},
		{name: "archive strips", sb: curated, method: "GET", url: "https://github.com/other/lib/archive/v1.zip", decision: "allow", layer: "request", rule: httppolicy.RuleArtifact, cred: "stripped"},
		{name: "graphql viewer", sb: curated, method: "POST", url: "https://api.github.com/graphql", body: `{"query":"{viewer{login}}"}`, decision: "allow", layer: "request", rule: httppolicy.RuleGraphQLViewer, cred: "swapped GH_TOKEN"},
		{name: "graphql other", sb: curated, method: "POST", url: "https://api.github.com/graphql", body: `{"query":"mutation{x}"}`, decision: "deny", layer: "request", rule: httppolicy.RuleGraphQL},
		{name: "paths rule", sb: curated, method: "GET", url: "https://api.example.com/v1/x", decision: "allow", layer: "request", rule: httppolicy.RulePath, reason: "egress.policy api.example.com: GET /v1/**"},
		{name: "paths default deny", sb: curated, method: "DELETE", url: "https://api.example.com/v1/x", decision: "deny", layer: "request", rule: httppolicy.RuleDefaultDeny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex, err := explain(tc.sb, api.ExplainRequest{Name: tc.sb.Name, Method: tc.method, URL: tc.url, Body: tc.body}, now)
			if err != nil {
				t.Fatal(err)
			}
			if ex.Decision != tc.decision || ex.Layer != tc.layer || ex.Rule != tc.rule || ex.Credential != tc.cred {
				t.Fatalf("%+v", ex)
			}
			if tc.reason != "" && ex.Reason != tc.reason {
				t.Fatalf("reason %q", ex.Reason)
			}
			if ex.Reason == "" || strings.ContainsAny(ex.Reason, "\n") {
				t.Fatalf("reason %q", ex.Reason)
			}
		})
	}
	// A worktree-bound sandbox pushes to its own branch only.
	wt := *curated
	wt.Labels = map[string]string{"nexus.branch": "feature/x"}
	if p := requestPolicy(&wt); len(p.Branches) != 1 || p.Branches[0] != "refs/heads/feature/x" {
		t.Fatalf("branches %v", p.Branches)
	}
	if p := requestPolicy(curated); len(p.Branches) != 0 {
		t.Fatalf("default branches %v", p.Branches)
	}
	for _, bad := range []api.ExplainRequest{
		{Method: "GE T", URL: "https://x.com/"},
		{Method: "GET", URL: "x.com/path"},
		{Method: "GET", URL: "ftp://x.com/"},
		{Method: "GET", URL: "https://x.com:99999/"},
		{Method: "GET", URL: "https://[::1]/"},
	} {
		if _, err := explain(curated, bad, now); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("explain(%+v) = %v, want invalid", bad, err)
		}
	}
}
