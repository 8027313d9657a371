package policy

import (
	"net/netip"
	"testing"
)

func TestDenyBeatsEveryAllow(t *testing.T) {
	rules, err := ParseRules([]string{"*.example.com", "api.example.org", "10.0.0.1:22"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAllowlist(rules)
	if err != nil {
		t.Fatal(err)
	}
	d, err := a.WithDeny([]string{"Secret.Example.com.", "api.example.org", "10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Match("secret.example.com", 443); ok {
		t.Error("a denied name below an allowed wildcard matched")
	}
	if _, ok := d.MatchName("api.example.org"); ok {
		t.Error("a denied exact name resolved")
	}
	if _, ok := d.MatchAddr(netip.MustParseAddr("10.0.0.1"), 22); ok {
		t.Error("a denied ip literal matched")
	}
	if _, ok := d.Match("other.example.com", 443); !ok {
		t.Error("a name the deny does not cover was refused")
	}
	if _, ok := a.Match("secret.example.com", 443); !ok {
		t.Error("WithDeny changed the allowlist it was called on")
	}
	if _, err := a.WithDeny([]string{"not a host"}); err == nil {
		t.Error("an invalid deny pattern was accepted")
	}
}
