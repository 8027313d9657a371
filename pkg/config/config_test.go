package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
)

const full = `version: 1
egress:
  allow:
    - registry.npmjs.org
    - codeload.github.com
    - "*.pypi.org:443"
  policy:
    github.com:
      repos: [Acme/App]
    api.github.com:
      repos:
        - acme/app
      paths:
        - GET /user
    API.Example.com:
      paths:
        - GET /v1/**
        - post /v1/items
  secrets:
    - name: EXAMPLE_TOKEN
      hosts: [api.example.com]
      env: EXAMPLE_TOKEN
`

func TestParseFull(t *testing.T) {
	c, err := Parse("config.yaml", []byte(full))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{Version: 1, Source: "config.yaml", Egress: Egress{
		Allow: []string{"registry.npmjs.org", "codeload.github.com", "*.pypi.org:443"},
		Policy: []httppolicy.HostRules{
			{Host: "github.com", Repos: []string{"acme/app"}},
			{Host: "api.github.com", Repos: []string{"acme/app"}, Paths: []string{"GET /user"}},
			{Host: "api.example.com", Paths: []string{"GET /v1/**", "POST /v1/items"}},
		},
		Secrets: []Secret{{Name: "EXAMPLE_TOKEN", Hosts: []string{"api.example.com"}, Env: "EXAMPLE_TOKEN"}},
	}}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate of a parsed config: %v", err)
	}
	// The JSON round trip the CLI → gateway hop makes keeps it valid and equal.
	b, _ := json.Marshal(c)
	var back Config
	if err := json.Unmarshal(b, &back); err != nil || back.Validate() != nil || !reflect.DeepEqual(&back, want) {
		t.Fatalf("round trip: %v %+v", err, back)
	}
	if _, err := httppolicy.New(c.HTTPPolicy([]string{"other/repo"})); err != nil {
		t.Fatalf("HTTPPolicy: %v", err)
	}
	hosts := c.Hosts()
	for _, h := range []string{"registry.npmjs.org", "*.pypi.org:443", "github.com", "api.example.com"} {
		if !contains(hosts, h) {
			t.Errorf("Hosts() %v lacks %s", hosts, h)
		}
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func TestConflictMessage(t *testing.T) {
	for _, tc := range []struct{ name, yaml, host string }{
		{"policy", "version: 1\negress:\n  allow: [GitHub.com]\n  policy:\n    github.com:\n      repos: [a/b]\n", "github.com"},
		{"policy upper", "version: 1\negress:\n  allow: [api.example.com:443]\n  policy:\n    API.EXAMPLE.COM:\n      paths: [GET /x]\n", "api.example.com"},
		{"secrets", "version: 1\negress:\n  allow: [api.example.com]\n  secrets:\n    - name: T\n      hosts: [Api.Example.Com]\n", "api.example.com"},
		{"allow after policy", "version: 1\negress:\n  policy:\n    x.io:\n      paths: [GET /]\n  allow: [X.IO]\n", "x.io"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("c.yaml", []byte(tc.yaml))
			want := `nexus config: host "` + tc.host + `" is listed under egress.allow and egress.policy; a host can be open (allow) or policy-gated (policy/secrets), not both — remove it from egress.allow`
			if err == nil || err.Error() != want {
				t.Fatalf("got  %v\nwant %s", err, want)
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("not ErrInvalid")
			}
		})
	}
	// Validate (JSON path) refuses it the same way.
	c := &Config{Version: 1, Egress: Egress{Allow: []string{"A.com"}, Policy: []httppolicy.HostRules{{Host: "a.com", Paths: []string{"GET /"}}}}}
	if err := c.Validate(); err == nil || err.Error() != ConflictError("a.com").Error() {
		t.Fatalf("Validate: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"empty", "", "nexus config: c.yaml: empty file: start it with `version: 1`"},
		{"comment only", "# nothing\n", "nexus config: c.yaml: empty file"},
		{"no version", "egress:\n  allow: [a.com]\n", "nexus config: c.yaml:1: version: missing"},
		{"version 2", "version: 2\n", `nexus config: c.yaml:1: version: "2" is not supported`},
		{"unknown top key", "version: 1\negres:\n  allow: []\n", `nexus config: c.yaml:2: unknown key "egres" in the top level (known: egress, version)`},
		{"unknown egress key", "version: 1\negress:\n  allow: []\n  deny: [x.com]\n", `nexus config: c.yaml:4: unknown key "deny" in egress (known: allow, allow_private, ask, limits, policy, secrets)`},
		{"unknown policy key", "version: 1\negress:\n  policy:\n    a.com:\n      path: [GET /]\n", `nexus config: c.yaml:5: unknown key "path" in egress.policy.a.com (known: paths, repos)`},
		{"unknown secret key", "version: 1\negress:\n  secrets:\n    - name: X\n      host: [a.com]\n", `nexus config: c.yaml:5: unknown key "host"`},
		{"bad allow host", "version: 1\negress:\n  allow:\n    - ok.com\n    - bad_host!.com\n", "nexus config: c.yaml:5: egress.allow: "},
		{"bad allow port", "version: 1\negress:\n  allow: [a.com:99999]\n", "nexus config: c.yaml:3: egress.allow: "},
		{"bad policy host", "version: 1\negress:\n  policy:\n    \"no spaces.com\":\n      paths: [GET /]\n", "nexus config: c.yaml:4: egress.policy: "},
		{"wildcard policy host", "version: 1\negress:\n  policy:\n    \"*.a.com\":\n      paths: [GET /]\n", "nexus config: c.yaml:4: egress.policy: host \"*.a.com\": policy hosts are exact names"},
		{"duplicate policy host", "version: 1\negress:\n  policy:\n    a.com:\n      paths: [GET /]\n    A.com:\n      paths: [GET /]\n", "nexus config: c.yaml:6: egress.policy: host a.com is listed twice"},
		{"bad glob", "version: 1\negress:\n  policy:\n    a.com:\n      paths:\n        - GET /v1/**x\n", "nexus config: c.yaml:6: egress.policy.a.com.paths: paths rule \"GET /v1/**x\": pattern \"/v1/**x\": ** must be a whole segment"},
		{"bad method", "version: 1\negress:\n  policy:\n    a.com:\n      paths: [FETCH /x]\n", "nexus config: c.yaml:5: egress.policy.a.com.paths: paths rule \"FETCH /x\": unknown method"},
		{"glob without slash", "version: 1\negress:\n  policy:\n    a.com:\n      paths: [GET v1]\n", "nexus config: c.yaml:5: egress.policy.a.com.paths: paths rule \"GET v1\": the path must start with /"},
		{"repos on non-github", "version: 1\negress:\n  policy:\n    a.com:\n      repos: [a/b]\n", "nexus config: c.yaml:5: egress.policy.a.com: repos rules apply to github.com"},
		{"bad repo", "version: 1\negress:\n  policy:\n    github.com:\n      repos: [justone]\n", "nexus config: c.yaml:5: egress.policy.github.com.repos: \"justone\" is not owner/repo"},
		{"host without rules", "version: 1\negress:\n  policy:\n    a.com: {}\n", "nexus config: c.yaml:4: egress.policy.a.com: give repos"},
		{"policy as list", "version: 1\negress:\n  policy: [a.com]\n", "nexus config: c.yaml:3: egress.policy: want a mapping"},
		{"allow as scalar", "version: 1\negress:\n  allow: a.com\n", "nexus config: c.yaml:3: egress.allow: want a list"},
		{"repeated key", "version: 1\nversion: 1\n", "nexus config: c.yaml:2: the top level: key \"version\" is repeated"},
		{"secret without name", "version: 1\negress:\n  secrets:\n    - hosts: [a.com]\n", "nexus config: c.yaml:4: egress.secrets entry: name is missing"},
		{"secret without hosts", "version: 1\negress:\n  secrets:\n    - name: T\n", "nexus config: c.yaml:4: egress.secrets T: hosts is missing"},
		{"secret bad env", "version: 1\negress:\n  secrets:\n    - name: T\n      hosts: [a.com]\n      env: 1BAD\n", "nexus config: c.yaml:6: egress.secrets: env \"1BAD\" is not a variable name"},
		{"secret bad host", "version: 1\negress:\n  secrets:\n    - name: T\n      hosts: [\"*.a.com\"]\n", "nexus config: c.yaml:5: egress.secrets: host \"*.a.com\""},
		{"secret twice", "version: 1\negress:\n  secrets:\n    - {name: T, hosts: [a.com]}\n    - {name: T, hosts: [b.com]}\n", "nexus config: c.yaml:5: egress.secrets: T is listed twice"},
		{"alias", "version: 1\negress:\n  allow: &a [a.com]\n  policy:\n    b.com:\n      paths: *a\n", "nexus config: c.yaml:6: egress.policy.b.com.paths: YAML aliases are not supported"},
		{"merge key", "version: 1\nbase: &b {allow: [a.com]}\n", `nexus config: c.yaml:2: unknown key "base"`},
		{"two documents", "version: 1\n---\nversion: 1\n", "nexus config: c.yaml:2: one YAML document only"},
		{"syntax", "version: 1\negress:\n  allow: [a.com\n", "nexus config: c.yaml:"},
		{"tab indentation", "version: 1\negress:\n\tallow: []\n", "nexus config: c.yaml:3: found character that cannot start any token"},
		{"top-level list", "- a\n", "nexus config: c.yaml:1: the top level: want a mapping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("c.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("got  %s\nwant %s…", err, tc.want)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("multi-line error %q", err)
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("not ErrInvalid: %v", err)
			}
		})
	}
}

func TestParseEmptyLists(t *testing.T) {
	c, err := Parse("c.yaml", []byte("version: 1\negress:\n  allow:\n  secrets: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Egress.Allow) != 0 || c.HTTPPolicy(nil).Empty() != true {
		t.Fatalf("%+v", c)
	}
}

func TestValidateRefuses(t *testing.T) {
	for _, c := range []*Config{
		{Version: 2},
		{Version: 1, Egress: Egress{Allow: []string{"bad host"}}},
		{Version: 1, Egress: Egress{Policy: []httppolicy.HostRules{{Host: "a.com"}}}},
		{Version: 1, Egress: Egress{Policy: []httppolicy.HostRules{{Host: "a.com", Paths: []string{"GET x"}}}}},
		{Version: 1, Egress: Egress{Policy: []httppolicy.HostRules{{Host: "a.com", Repos: []string{"a/b"}}}}},
		{Version: 1, Egress: Egress{Policy: []httppolicy.HostRules{{Host: "a.com", Paths: []string{"GET /"}}, {Host: "A.COM", Paths: []string{"GET /"}}}}},
		{Version: 1, Egress: Egress{Secrets: []Secret{{Name: "x y", Hosts: []string{"a.com"}}}}},
		{Version: 1, Egress: Egress{Secrets: []Secret{{Name: "X"}}}},
		{Version: 1, Egress: Egress{Secrets: []Secret{{Name: "X", Hosts: []string{"a.com"}, Env: "A-B"}}}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) accepted", c)
		}
	}
}

func TestLoadAndFind(t *testing.T) {
	root := t.TempDir()
	sub := filepath.Join(root, "a", "b")
	os.MkdirAll(sub, 0o755)
	if p, err := Find(sub); err != nil || p != "" {
		t.Fatalf("outside a work tree: %q %v", p, err)
	}
	os.Mkdir(filepath.Join(root, ".git"), 0o755)
	if p, err := Find(sub); err != nil || p != "" {
		t.Fatalf("work tree without config: %q %v", p, err)
	}
	os.Mkdir(filepath.Join(root, ".nexus"), 0o755)
	cfg := filepath.Join(root, ".nexus", "config.yaml")
	os.WriteFile(cfg, []byte(full), 0o644)
	p, err := Find(sub)
	if err != nil || p != cfg {
		t.Fatalf("Find = %q %v, want %s", p, err, cfg)
	}
	c, err := Load(p)
	if err != nil || c.Source != cfg {
		t.Fatalf("Load: %v %+v", err, c)
	}
	// A nested work tree (a submodule's .git file) stops the walk.
	os.WriteFile(filepath.Join(root, "a", ".git"), []byte("gitdir: ../.git/modules/a\n"), 0o644)
	if p, _ := Find(sub); p != "" {
		t.Fatalf("nested work tree: %q", p)
	}
	if _, err := Load(filepath.Join(root, "missing.yaml")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	big := filepath.Join(root, "big.yaml")
	os.WriteFile(big, []byte("version: 1\n#"+strings.Repeat("x", MaxBytes)), 0o644)
	if _, err := Load(big); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("big: %v", err)
	}
	bad := filepath.Join(root, "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\nx: 1\n"), 0o644)
	if _, err := Load(bad); err == nil || !strings.HasPrefix(err.Error(), "nexus config: "+bad+":2: ") {
		t.Fatalf("position: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(full))
	f.Add([]byte("version: 1\negress:\n  allow: [a.com]\n  policy:\n    a.com:\n      paths: [GET /]\n"))
	f.Add([]byte("version: 1\negress:\n  allow: &a [a.com]\n  secrets: *a\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("version: 1\negress:\n  policy:\n    github.com: {repos: [x/y], paths: [\"* /**\"]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("f.yaml", data)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\r\n") || !strings.HasPrefix(err.Error(), "nexus config: ") {
				t.Fatalf("bad error %q", err)
			}
			return
		}
		// Whatever parses is valid on the JSON path too, and compiles into an engine.
		b, _ := json.Marshal(c)
		var back Config
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if err := back.Validate(); err != nil {
			t.Fatalf("parsed config fails Validate: %v", err)
		}
		if _, err := httppolicy.New(c.HTTPPolicy(nil)); err != nil {
			t.Fatalf("parsed config does not compile: %v", err)
		}
	})
}

func TestEgressAsk(t *testing.T) {
	c, err := Parse("c.yaml", []byte("version: 1\negress:\n  ask: true\n"))
	if err != nil || !c.Egress.Ask {
		t.Fatalf("egress.ask: true: %+v %v", c, err)
	}
	if _, err := Parse("c.yaml", []byte("version: 1\negress:\n  ask: maybe\n")); err == nil || !strings.Contains(err.Error(), "egress.ask") {
		t.Fatalf("egress.ask: maybe: %v", err)
	}
}
