package credbroker

import (
	"errors"
	"slices"
	"strings"
	"testing"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// TestStoredHostsAreTheCeiling: the hosts stored with a secret (names or *.domain) bound every
// mint, whoever asked for it; a secret stored without hosts mints for the hosts it is given
// (the gateway lets only the user's own --secret ask for that).
func TestStoredHostsAreTheCeiling(t *testing.T) {
	b := testBroker(t, t.TempDir(), nil)
	for _, req := range []credapi.SecretSetRequest{
		{Name: "API", Value: "v1", Hosts: []string{"API.example.com"}},
		{Name: "WILD", Value: "v2", Hosts: []string{"*.Example.org", "example.org"}},
		{Name: "OPEN", Value: "v3"},
	} {
		if err := b.Set(req); err != nil {
			t.Fatalf("set %s: %v", req.Name, err)
		}
	}
	list, err := b.List()
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string][]string{}
	for _, s := range list {
		hosts[s.Name] = s.Hosts
	}
	if !slices.Equal(hosts["WILD"], []string{"*.example.org", "example.org"}) || !slices.Equal(hosts["API"], []string{"api.example.com"}) || len(hosts["OPEN"]) != 0 {
		t.Fatalf("stored hosts = %v", hosts)
	}
	for _, c := range []struct {
		secret string
		hosts  []string
		ok     bool
	}{
		{"API", []string{"api.example.com"}, true},
		{"API", []string{"evil.example"}, false},
		{"API", []string{"api.example.com", "evil.example"}, false},
		{"WILD", []string{"a.example.org", "example.org"}, true},
		{"WILD", []string{"example.org.evil.example"}, false},
		{"OPEN", []string{"anything.example"}, true},
	} {
		_, err := b.Mint(credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{{Secret: c.secret, Hosts: c.hosts}}})
		if c.ok != (err == nil) {
			t.Errorf("mint %s@%v: %v", c.secret, c.hosts, err)
		}
		if err != nil && (!errors.Is(err, errdefs.ErrRefused) || !strings.Contains(err.Error(), "secret "+c.secret+" may not be sent to ")) {
			t.Errorf("mint %s@%v: %v, want a refusal naming the secret", c.secret, c.hosts, err)
		}
	}
	// A binding without hosts takes the stored exact names, never a wildcard.
	res, err := b.Mint(credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{{Secret: "WILD"}}})
	if err != nil || len(res.Credentials) != 1 || !slices.Equal(res.Credentials[0].Hosts, []string{"example.org"}) {
		t.Fatalf("mint WILD without hosts: %+v, %v", res.Credentials, err)
	}
	for _, bad := range [][]string{{"*"}, {"*.com"}, {"a.example:443"}, {"a b"}, {"https://a.example"}} {
		if err := b.Set(credapi.SecretSetRequest{Name: "X", Value: "x", Hosts: bad}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("set with hosts %q: %v, want invalid", bad, err)
		}
	}
}

// TestMintCarriesTheHeader: a binding naming a header hands it to the mitm with every placeholder
// of the binding; a header that frames or routes a request is refused.
func TestMintCarriesTheHeader(t *testing.T) {
	b := testBroker(t, t.TempDir(), nil)
	b.Set(credapi.SecretSetRequest{Name: "ANTHROPIC_API_KEY", Value: "sk-ant", Hosts: []string{"api.anthropic.com"}})
	res, err := b.Mint(credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{
		{Secret: "ANTHROPIC_API_KEY", Hosts: []string{"api.anthropic.com"}, Kind: credapi.KindAnthropic, Header: "X-Api-Key"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Credentials) != 2 {
		t.Fatalf("credentials = %+v", res.Credentials)
	}
	// Clients send ANTHROPIC_API_KEY as x-api-key (ANTHROPIC_AUTH_TOKEN as Bearer).
	if !hex64.MatchString(res.Env["ANTHROPIC_API_KEY"]) || res.Env["ANTHROPIC_AUTH_TOKEN"] != "" {
		t.Errorf("guest variables of an x-api-key Anthropic binding: %v", keysOf(res.Env))
	}
	for _, c := range res.Credentials {
		if c.Header != "x-api-key" {
			t.Errorf("credential %+v: header %q, want x-api-key", c.Hosts, c.Header)
		}
	}
	if _, err := b.Mint(credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{
		{Secret: "ANTHROPIC_API_KEY", Hosts: []string{"api.anthropic.com"}, Header: "Host"}}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("header Host: %v, want invalid", err)
	}
}

func keysOf(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
