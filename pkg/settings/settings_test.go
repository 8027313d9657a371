package settings

import (
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// load parses args on a flag set holding every setting, as `nexus up` has them.
func load(t *testing.T, args ...string) (*Values, error) {
	t.Helper()
	fs := pflag.NewFlagSet("up", pflag.ContinueOnError)
	AddFlags(fs, Global)
	AddFlags(fs, Stack)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return Load(fs)
}

// clearEnv unsets every variable of the table for the test.
func clearEnv(t *testing.T) {
	for _, s := range Table {
		t.Setenv(s.Env, "")
	}
}

func TestTableRows(t *testing.T) {
	flags, envs := map[string]bool{}, map[string]bool{}
	for _, s := range Table {
		if s.Flag == "" || s.Env == "" || s.Help == "" || s.Arg == "" || s.set == nil {
			t.Errorf("row %+v lacks a flag, variable, help, argument or parser", s)
		}
		if !strings.HasPrefix(s.Env, "NEXUS_") {
			t.Errorf("--%s: variable %s is not NEXUS_*", s.Flag, s.Env)
		}
		if flags[s.Flag] || envs[s.Env] {
			t.Errorf("--%s / %s declared twice", s.Flag, s.Env)
		}
		flags[s.Flag], envs[s.Env] = true, true
	}
}

func TestFlagBeatsEnvBeatsDefault(t *testing.T) {
	clearEnv(t)
	v, err := load(t)
	if err != nil {
		t.Fatal(err)
	}
	if v.Host != "local" || v.BusPort != 4244 || v.GitrelaySSH != "ssh" || v.Accel != "auto" {
		t.Errorf("defaults: host %q port %d ssh %q accel %q", v.Host, v.BusPort, v.GitrelaySSH, v.Accel)
	}
	if v.Cache != "" || v.BusURL != "" || v.UpstreamDNS != "" {
		t.Errorf("unset settings got values: cache %q url %q dns %q", v.Cache, v.BusURL, v.UpstreamDNS)
	}

	t.Setenv("NEXUS_HOST", "envhost")
	t.Setenv("NEXUS_BUS_PORT", "5001")
	t.Setenv("NEXUS_GITRELAY_SSH_OPTS", "-F /dev/null  -o A=b")
	v, err = load(t)
	if err != nil {
		t.Fatal(err)
	}
	if v.Host != "envhost" || v.BusPort != 5001 || strings.Join(v.GitrelaySSHOpts, "|") != "-F|/dev/null|-o|A=b" {
		t.Errorf("env: host %q port %d opts %q", v.Host, v.BusPort, v.GitrelaySSHOpts)
	}

	v, err = load(t, "--host", "flaghost", "--bus-port=5002")
	if err != nil {
		t.Fatal(err)
	}
	if v.Host != "flaghost" || v.BusPort != 5002 {
		t.Errorf("flag: host %q port %d, want flaghost 5002", v.Host, v.BusPort)
	}
}

func TestHome(t *testing.T) {
	clearEnv(t)
	hh := t.TempDir()
	t.Setenv("HOME", hh)
	v, err := load(t)
	if err != nil {
		t.Fatal(err)
	}
	if want := home.Dir(filepath.Join(hh, ".local", "share", "nexus")); v.Home != want {
		t.Errorf("default home = %s, want %s", v.Home, want)
	}
	t.Setenv("NEXUS_HOME", "rel/dir")
	v, err = load(t)
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(string(v.Home)) || !strings.HasSuffix(string(v.Home), "rel/dir") {
		t.Errorf("NEXUS_HOME=rel/dir gave %s, want it made absolute", v.Home)
	}
	v, err = load(t, "--home", "/x/y", "--cache", "/c")
	if err != nil {
		t.Fatal(err)
	}
	if v.Home != "/x/y" || v.Cache != "/c" {
		t.Errorf("--home /x/y --cache /c gave %s %s", v.Home, v.Cache)
	}
}

func TestBadValues(t *testing.T) {
	for _, c := range []struct{ env, val, flag string }{
		{"NEXUS_BUS_PORT", "abc", "bus-port"},
		{"NEXUS_BUS_PORT", "70000", "bus-port"},
		{"NEXUS_BUS_URL", "127.0.0.1", "bus-url"},
		{"NEXUS_HOST", "a.b", "host"},
		{"NEXUS_ACCEL", "hvf", "accel"},
		{"NEXUS_MITM_ADDR", "nowhere", "mitm-addr"},
		{"NEXUS_UPSTREAM_DNS", "dns.example:53", "upstream-dns"},
		{"NEXUS_CLAUDE_TOKEN_URL", "ftp://x", "claude-token-url"},
	} {
		t.Run(c.env+"="+c.val, func(t *testing.T) {
			clearEnv(t)
			check := func(err error) {
				t.Helper()
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid", err)
				}
				m := err.Error()
				if !strings.HasPrefix(m, "--"+c.flag+" (or $"+c.env+"): ") || !strings.Contains(m, c.val) || strings.Contains(m, "\n") {
					t.Errorf("error %q: want one line naming --%s, $%s and the value", m, c.flag, c.env)
				}
			}
			t.Setenv(c.env, c.val)
			_, err := load(t)
			check(err)
			t.Setenv(c.env, "")
			_, err = load(t, "--"+c.flag, c.val)
			check(err)
		})
	}
}

// TestOnlyDeclared: a command loads the settings it declares; the CLI's commands do not fail
// on a bad stack setting they never use.
func TestOnlyDeclared(t *testing.T) {
	clearEnv(t)
	t.Setenv("NEXUS_ACCEL", "bogus")
	fs := pflag.NewFlagSet("ps", pflag.ContinueOnError)
	AddFlags(fs, Global)
	v, err := Load(fs)
	if err != nil {
		t.Fatalf("a CLI command failed on a stack setting: %v", err)
	}
	if v.Accel != "" || v.BusPort != 4244 {
		t.Errorf("accel %q port %d", v.Accel, v.BusPort)
	}
}

func TestInvalidNamesTheSetting(t *testing.T) {
	err := Invalid("gitrelay-hosts", errors.New("gitrelay: host alias \"x\": bad host"))
	if !errors.Is(err, errdefs.ErrInvalid) || err.Error() != `--gitrelay-hosts (or $NEXUS_GITRELAY_HOSTS): gitrelay: host alias "x": bad host` {
		t.Errorf("Invalid = %v", err)
	}
}

func TestResolve(t *testing.T) {
	clearEnv(t)
	t.Setenv("NEXUS_RESOLVE", "env.example=127.0.0.1:1")
	v, err := load(t, "--resolve", "API.github.com=127.0.0.1:4443,github.com=127.0.0.1:4444", "--resolve=x.test=10.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"api.github.com": "127.0.0.1:4443", "github.com": "127.0.0.1:4444", "x.test": "10.0.0.1"}
	if len(v.Resolve) != len(want) {
		t.Errorf("--resolve twice = %v, want %v (the flags replace $NEXUS_RESOLVE)", v.Resolve, want)
	}
	for h, a := range want {
		if v.Resolve[h] != a {
			t.Errorf("resolve[%s] = %q, want %q", h, v.Resolve[h], a)
		}
	}
	v, err = load(t)
	if err != nil || v.Resolve["env.example"] != "127.0.0.1:1" {
		t.Errorf("NEXUS_RESOLVE: %v, %v", v.Resolve, err)
	}
	if _, err := load(t, "--resolve", "nohost"); err == nil || !strings.HasPrefix(err.Error(), "--resolve (or $NEXUS_RESOLVE): ") {
		t.Errorf("--resolve nohost: %v", err)
	}
}

func TestExtraCA(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	srv.Close()
	good := filepath.Join(dir, "ca.pem")
	os.WriteFile(good, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	empty := filepath.Join(dir, "empty.pem")
	os.WriteFile(empty, []byte("not pem\n"), 0o600)

	t.Setenv("NEXUS_EXTRA_CA", good)
	v, err := load(t)
	if err != nil || len(v.ExtraRoots) != 1 || !v.ExtraRoots[0].Equal(srv.Certificate()) {
		t.Fatalf("NEXUS_EXTRA_CA: %d roots, %v", len(v.ExtraRoots), err)
	}
	for _, bad := range []string{empty, filepath.Join(dir, "missing.pem")} {
		if _, err := load(t, "--extra-ca", bad); !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), "--extra-ca (or $NEXUS_EXTRA_CA): ") {
			t.Errorf("--extra-ca %s: %v", bad, err)
		}
	}
}
