package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

func TestPlanEgress(t *testing.T) {
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	claude := profile.Default()
	secrets := func(names ...string) storedSecrets {
		return func(n string) ([]string, bool) {
			for _, s := range names {
				if s == n {
					return nil, true
				}
			}
			return nil, false
		}
	}
	t.Run("profile hosts make a curated default", func(t *testing.T) {
		p, err := planEgress(api.CreateRequest{}, claude, now, secrets())
		if err != nil {
			t.Fatal(err)
		}
		if p.egress.Mode != api.EgressCurated || !strings.Contains(strings.Join(p.hosts, " "), "api.anthropic.com") {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("repo brings the GitHub hosts and GH_TOKEN when it is stored", func(t *testing.T) {
		p, err := planEgress(api.CreateRequest{Repos: []string{"Owner/Repo"}}, claude, now, secrets("GH_TOKEN"))
		if err != nil {
			t.Fatal(err)
		}
		if len(p.secrets) != 1 || p.secrets[0].Name != "GH_TOKEN" || p.secrets[0].Kind != "github" || p.egress.Repos[0] != "owner/repo" {
			t.Fatalf("%+v", p)
		}
		for _, h := range GitHubHosts {
			if !strings.Contains(strings.Join(p.hosts, " "), h) {
				t.Errorf("%s missing from %v", h, p.hosts)
			}
		}
	})
	t.Run("a create kept from stored secrets binds none by default", func(t *testing.T) {
		codex, err := profile.Get("codex")
		if err != nil {
			t.Fatal(err)
		}
		stored := secrets("GH_TOKEN", "OPENAI_API_KEY")
		p, err := planEgress(api.CreateRequest{Repos: []string{"owner/repo"}}, codex, now, stored)
		if err != nil || len(p.secrets) != 2 {
			t.Fatalf("without the limit, --repo and codex bind GH_TOKEN and OPENAI_API_KEY: %v %+v", err, p)
		}
		p, err = planEgress(api.CreateRequest{Repos: []string{"owner/repo"}, NoStoredSecrets: true}, codex, now, stored)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.secrets) != 0 {
			t.Fatalf("NoStoredSecrets still bound %+v", p.secrets)
		}
		if h := strings.Join(p.hosts, " "); !strings.Contains(h, "api.github.com") || !strings.Contains(h, "api.openai.com") {
			t.Errorf("the hosts stay allowed, without credentials: %s", h)
		}
	})
	t.Run("allow-all expires and seeds nothing", func(t *testing.T) {
		p, err := planEgress(api.CreateRequest{EgressMode: "allow-all=90m", Secrets: []string{"X@a.example"}, UserSecrets: true}, claude, now, secrets("X"))
		if err != nil {
			t.Fatal(err)
		}
		if p.egress.Mode != api.EgressAllowAll || !p.egress.AllowAllUntil.Equal(now.Add(90*time.Minute)) || len(p.secrets) != 0 {
			t.Fatalf("%+v", p)
		}
		p, _ = planEgress(api.CreateRequest{EgressMode: "allow-all"}, claude, now, secrets())
		if !p.egress.AllowAllUntil.Equal(now.Add(DefaultAllowAll)) {
			t.Fatalf("default allow-all until %v", p.egress.AllowAllUntil)
		}
	})
	t.Run("a recorded plan comes back the same", func(t *testing.T) {
		p, _ := planEgress(api.CreateRequest{AllowHosts: []string{"db.example:5432", "*.npmjs.org"}}, claude, now, secrets())
		back, err := planFromRecord(&api.Sandbox{Name: "x/y", Egress: p.egress, Secrets: p.secrets})
		if err != nil || len(back.rules) != len(p.rules) || strings.Join(back.hosts, ",") != strings.Join(p.hosts, ",") {
			t.Fatalf("%+v vs %+v (%v)", back, p, err)
		}
	})
	for _, bad := range []api.CreateRequest{
		{EgressMode: "open"},
		{EgressMode: "allow-all=soon"},
		{EgressMode: "none=1h"},
		{AllowHosts: []string{"bad host"}},
		{Repos: []string{"not-a-repo"}},
		{Secrets: []string{"NOHOST"}},
		{Secrets: []string{"MISSING@api.example"}},
	} {
		if _, err := planEgress(bad, claude, now, secrets()); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: got %v, want invalid", bad, err)
		}
	}
}
