package policy

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
)

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      bool
	}{
		{in: "api.github.com", want: "api.github.com:443,80"},
		{in: "API.GitHub.com.", want: "api.github.com:443,80"},
		{in: "db.internal:5432", want: "db.internal:5432"},
		{in: "*.githubusercontent.com", want: "*.githubusercontent.com:443,80"},
		{in: "10.0.0.5:22", want: "10.0.0.5:22"},
		{in: "*.com", err: true},
		{in: "*.10.0.0.1", err: true},
		{in: "host:0", err: true},
		{in: "host:70000", err: true},
		{in: "host:x", err: true},
		{in: "bad_host!", err: true},
		{in: "", err: true},
		{in: "-a.com", err: true},
		{in: "[::1]:443", err: true},
		{in: "::1", err: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			r, err := ParseRule(tc.in)
			if tc.err {
				if err == nil || !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("ParseRule(%q) = %v, %v; want invalid error", tc.in, r, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRule(%q): %v", tc.in, err)
			}
			if got := r.String(); got != tc.want {
				t.Fatalf("ParseRule(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestAllowlistMatch(t *testing.T) {
	rules, err := ParseRules([]string{"api.github.com", "*.example.org", "db.internal:5432", "10.1.2.3:22"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAllowlist(rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		port int
		want string
	}{
		{"api.github.com", 443, "api.github.com:443,80"},
		{"API.GITHUB.COM.", 80, "api.github.com:443,80"},
		{"api.github.com", 22, ""},
		{"github.com", 443, ""},
		{"evilapi.github.com", 443, ""},
		{"a.example.org", 443, "*.example.org:443,80"},
		{"a.b.example.org", 80, "*.example.org:443,80"},
		{"example.org", 443, ""},
		{"badexample.org", 443, ""},
		{"db.internal", 5432, "db.internal:5432"},
		{"db.internal", 443, ""},
	} {
		r, ok := a.Match(tc.name, tc.port)
		got := ""
		if ok {
			got = r.String()
		}
		if got != tc.want {
			t.Errorf("Match(%q, %d) = %q, want %q", tc.name, tc.port, got, tc.want)
		}
	}
	if _, ok := a.MatchName("db.internal"); !ok {
		t.Error("MatchName(db.internal) = false")
	}
	if _, ok := a.MatchName("other.internal"); ok {
		t.Error("MatchName(other.internal) = true")
	}
	if r, ok := a.MatchAddr(netip.MustParseAddr("10.1.2.3"), 22); !ok || r.Host != "10.1.2.3" {
		t.Errorf("MatchAddr(10.1.2.3:22) = %v %v", r, ok)
	}
	if _, ok := a.MatchAddr(netip.MustParseAddr("10.1.2.3"), 23); ok {
		t.Error("MatchAddr(10.1.2.3:23) = true")
	}
	var zero *Allowlist
	if _, ok := zero.Match("api.github.com", 443); ok {
		t.Error("nil allowlist matched")
	}
}
