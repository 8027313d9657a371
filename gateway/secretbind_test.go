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
	"github.com/IniZio/nexus/pkg/profile"
)

// TestSecretCeiling: whoever stores a secret decides where it may go. The user's own
// `nexus create --secret`, an MCP sandbox_create and a project's .nexus/config.yaml may each bind
// a subset of the stored hosts and never another host; a secret stored without hosts is bound
// only by the user's --secret. Refusals are one line naming the secret and the host.
func TestSecretCeiling(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	store := map[string][]string{
		"OPEN":  nil, // stored before hosts were recorded, or without --host
		"API":   {"api.example.com"},
		"WILD":  {"*.example.com"},
		"MULTI": {"a.example.net", "b.example.net"},
	}
	stored := storedSecrets(func(n string) ([]string, bool) { h, ok := store[n]; return h, ok })
	configFor := func(t *testing.T, secret, host string) *config.Config {
		c, err := config.Parse("/w/.nexus/config.yaml", []byte("version: 1\negress:\n  secrets:\n    - {name: "+secret+", hosts: ["+host+"]}\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	type origin int
	const (
		cli origin = iota
		mcp
		cfg
	)
	for _, c := range []struct {
		origin       origin
		secret, host string
		ok           bool
	}{
		{cli, "OPEN", "anything.example", true},
		{mcp, "OPEN", "anything.example", false},
		{cfg, "OPEN", "anything.example", false},

		{cli, "API", "api.example.com", true},
		{mcp, "API", "api.example.com", true},
		{cfg, "API", "api.example.com", true},
		{cli, "API", "evil.example", false},
		{mcp, "API", "evil.example", false},
		{cfg, "API", "evil.example", false},
		{cfg, "API", "API.Example.com.", true}, // compared normalized

		{cli, "WILD", "a.example.com", true},
		{mcp, "WILD", "deep.a.example.com", true},
		{cfg, "WILD", "a.example.com", true},
		{cli, "WILD", "example.com", false}, // *.example.com is strictly below example.com
		{cfg, "WILD", "example.com.evil.example", false},

		{mcp, "MULTI", "b.example.net", true},
		{mcp, "MULTI", "c.example.net", false},
	} {
		name := []string{"cli", "mcp", "config"}[c.origin] + "/" + c.secret + "@" + c.host
		t.Run(name, func(t *testing.T) {
			var r api.CreateRequest
			switch c.origin {
			case cli:
				r = api.CreateRequest{Secrets: []string{c.secret + "@" + c.host}, UserSecrets: true}
			case mcp:
				r = api.CreateRequest{Secrets: []string{c.secret + "@" + c.host}}
			case cfg:
				r = api.CreateRequest{Config: configFor(t, c.secret, c.host)}
			}
			p, err := planEgress(r, profile.Default(), now, stored)
			if !c.ok {
				host := strings.TrimSuffix(strings.ToLower(c.host), ".")
				if !errors.Is(err, errdefs.ErrRefused) || !strings.Contains(err.Error(), "secret "+c.secret+" may not be sent to "+host) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("err = %v, want a one-line refusal naming %s and %s", err, c.secret, host)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(p.secrets) != 1 || p.secrets[0].Name != c.secret || len(p.secrets[0].Hosts) != 1 {
				t.Fatalf("bindings = %+v", p.secrets)
			}
		})
	}

	t.Run("several hosts: one outside refuses the whole binding", func(t *testing.T) {
		_, err := planEgress(api.CreateRequest{Secrets: []string{"MULTI@a.example.net,evil.example"}}, profile.Default(), now, stored)
		if !errors.Is(err, errdefs.ErrRefused) || !strings.Contains(err.Error(), "secret MULTI may not be sent to evil.example: it is stored for a.example.net,b.example.net only") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("refusal says how to widen the ceiling", func(t *testing.T) {
		_, err := planEgress(api.CreateRequest{Config: configFor(t, "OPEN", "api.example.com")}, profile.Default(), now, stored)
		want := "egress.secrets in /w/.nexus/config.yaml: secret OPEN may not be sent to api.example.com: it is stored without hosts, so only `nexus create --secret OPEN@api.example.com` can bind it (or store its hosts: `nexus secret set OPEN --host api.example.com`)"
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v\nwant %s", err, want)
		}
	})
}

// TestRepoSecretNarrowed: --repo's GH_TOKEN binding (nexus's own choice of GitHub hosts) is kept
// within the hosts GH_TOKEN is stored for; stored without hosts, it binds all three as before.
func TestRepoSecretNarrowed(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		stored, want []string
	}{
		{nil, []string{"api.github.com", "uploads.github.com", "github.com"}},
		{[]string{"api.github.com"}, []string{"api.github.com"}},
		{[]string{"*.github.com"}, []string{"api.github.com", "uploads.github.com"}},
		{[]string{"gitlab.example"}, nil},
	} {
		stored := storedSecrets(func(n string) ([]string, bool) { return c.stored, n == GitHubSecret })
		p, err := planEgress(api.CreateRequest{Repos: []string{"acme/app"}}, profile.Default(), now, stored)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range p.secrets {
			if s.Name == GitHubSecret {
				got = s.Hosts
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("stored %v: GH_TOKEN bound to %v, want %v", c.stored, got, c.want)
		}
	}
}

// TestSecretHeaderBinding: --secret NAME@host:header=NAME and egress.secrets[].header name the
// header the placeholder is swapped in; headers that frame or route a request are refused.
func TestSecretHeaderBinding(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	stored := storedSecrets(func(n string) ([]string, bool) { return []string{"api.anthropic.com"}, n == "ANTHROPIC_API_KEY" })
	p, err := planEgress(api.CreateRequest{Secrets: []string{"ANTHROPIC_API_KEY@api.anthropic.com:header=X-Api-Key"}, UserSecrets: true}, profile.Default(), now, stored)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.secrets) != 1 || p.secrets[0].Header != "x-api-key" || !slices.Equal(p.secrets[0].Hosts, []string{"api.anthropic.com"}) {
		t.Fatalf("bindings = %+v", p.secrets)
	}
	if b := p.bindings(); len(b) != 1 || b[0].Header != "x-api-key" {
		t.Fatalf("credbroker bindings = %+v", b)
	}
	c, err := config.Parse("c.yaml", []byte("version: 1\negress:\n  secrets:\n    - {name: ANTHROPIC_API_KEY, hosts: [api.anthropic.com], header: x-api-key}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p, err = planEgress(api.CreateRequest{Config: c}, profile.Default(), now, stored); err != nil || len(p.secrets) != 1 || p.secrets[0].Header != "x-api-key" {
		t.Fatalf("config binding: %+v, %v", p, err)
	}
	for _, bad := range []string{
		"ANTHROPIC_API_KEY@api.anthropic.com:header=host",
		"ANTHROPIC_API_KEY@api.anthropic.com:header=content-length",
		"ANTHROPIC_API_KEY@api.anthropic.com:header=x api",
		"ANTHROPIC_API_KEY@api.anthropic.com:443",
		"ANTHROPIC_API_KEY@api.anthropic.com:hdr=x",
	} {
		if _, err := planEgress(api.CreateRequest{Secrets: []string{bad}, UserSecrets: true}, profile.Default(), now, stored); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: err = %v, want invalid", bad, err)
		}
	}
	if _, err := config.Parse("c.yaml", []byte("version: 1\negress:\n  secrets:\n    - {name: X, hosts: [a.example], header: transfer-encoding}\n")); err == nil || !strings.Contains(err.Error(), "cannot carry a credential") {
		t.Errorf("config header transfer-encoding: %v", err)
	}
}
