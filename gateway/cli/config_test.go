package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/config"
)

func runCLI(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	t.Setenv("HOME", t.TempDir())
	t.Setenv("NEXUS_HOME", t.TempDir())
	if dir != "" {
		t.Chdir(dir)
	}
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func writeConfig(t *testing.T, root, body string) string {
	t.Helper()
	os.MkdirAll(filepath.Join(root, ".git"), 0o755)
	os.MkdirAll(filepath.Join(root, ".nexus"), 0o755)
	p := filepath.Join(root, ".nexus", "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigCheck(t *testing.T) {
	root := t.TempDir()
	p := writeConfig(t, root, `version: 1
egress:
  allow: [registry.npmjs.org]
  policy:
    github.com:
      repos: [acme/app]
    api.example.com:
      paths: ["GET /v1/**"]
  secrets:
    - {name: EX, hosts: [api.example.com], env: EX_TOKEN}
`)
	sub := filepath.Join(root, "src", "pkg")
	os.MkdirAll(sub, 0o755)
	out, err := runCLI(t, sub, "config", "check")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{p + ": valid (version 1)", "registry.npmjs.org", "open", "repos acme/app",
		"archive and release downloads of any repo, credential stripped", "GET /v1/**", "default-deny", "EX → api.example.com as $EX_TOKEN"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI(t, "", "config", "check", "--json", p)
	if err != nil || !strings.Contains(out, `"host": "github.com"`) {
		t.Fatalf("--json: %v\n%s", err, out)
	}
}

func TestConfigCheckRefuses(t *testing.T) {
	root := t.TempDir()
	p := writeConfig(t, root, "version: 1\negress:\n  allow: [API.github.com]\n  policy:\n    api.github.com:\n      paths: [GET /user]\n")
	_, err := runCLI(t, "", "config", "check", p)
	want := `nexus config: host "api.github.com" is listed under egress.allow and egress.policy; a host can be open (allow) or policy-gated (policy/secrets), not both — remove it from egress.allow`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v", err)
	}
	os.WriteFile(p, []byte("version: 1\negress:\n  policy:\n    a.com:\n      paths: [\"GET /a/**b\"]\n"), 0o644)
	if _, err := runCLI(t, "", "config", "check", p); err == nil || !strings.HasPrefix(err.Error(), "nexus config: "+p+":5: ") {
		t.Fatalf("got %v", err)
	}
	if _, err := runCLI(t, t.TempDir(), "config", "check"); err == nil || !strings.Contains(err.Error(), "no .nexus/config.yaml at the git root") {
		t.Fatalf("no config: %v", err)
	}
}

func TestCreateConfig(t *testing.T) {
	root := t.TempDir()
	p := writeConfig(t, root, "version: 1\negress:\n  allow: [a.com]\n")
	t.Chdir(root)
	c, err := config.ForCreate("")
	if err != nil || c == nil || c.Source != p {
		t.Fatalf("found %+v %v", c, err)
	}
	t.Chdir(t.TempDir())
	if c, err := config.ForCreate(""); err != nil || c != nil {
		t.Fatalf("outside a project: %+v %v", c, err)
	}
	if _, err := config.ForCreate(filepath.Join(root, "nope.yaml")); err == nil {
		t.Fatal("missing --config accepted")
	}
	// A bad config stops the create before anything is sent.
	bad := filepath.Join(root, "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\negress:\n  alow: []\n"), 0o644)
	out, err := runCLI(t, "", "create", "--config", bad, "x")
	if err == nil || !strings.Contains(err.Error(), bad+":3: unknown key \"alow\"") {
		t.Fatalf("create with a bad config: %v\n%s", err, out)
	}
}
