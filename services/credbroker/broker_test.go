package credbroker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/errdefs"
)

func testBroker(t *testing.T, dir string, logs *testutil.SyncBuffer) *Broker {
	t.Helper()
	cfg := brokerConfig{Dir: dir, Logger: zerolog.Nop()}
	if logs != nil {
		cfg.Logger = zerolog.New(logs).Level(zerolog.TraceLevel)
	}
	b, err := newBroker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const ghValue = "ghp_realvalue_0123456789_SECRET"

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

func TestStoreEncryptedAndPersistent(t *testing.T) {
	dir := t.TempDir()
	b := testBroker(t, dir, nil)
	if err := b.Set(credapi.SecretSetRequest{Name: "GH_TOKEN", Value: ghValue, Hosts: []string{"API.GitHub.com."}}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(ghValue)) || bytes.Contains(raw, []byte("GH_TOKEN")) {
		t.Fatal("the store file holds plaintext")
	}
	for _, f := range []string{KeyFile, StoreFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	key, _ := os.ReadFile(filepath.Join(dir, KeyFile))
	if len(key) != 32 {
		t.Fatalf("key is %d bytes", len(key))
	}

	// A restart reads the same store with the same key.
	b2 := testBroker(t, dir, nil)
	list, err := b2.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "GH_TOKEN" || list[0].Source != "value" || list[0].Hosts[0] != "api.github.com" || list[0].Updated.IsZero() {
		t.Fatalf("list = %+v", list)
	}
	lj, _ := json.Marshal(list)
	if bytes.Contains(lj, []byte(ghValue)) {
		t.Fatal("List shows a value")
	}
	if err := b2.Remove("GH_TOKEN"); err != nil {
		t.Fatal(err)
	}
	if err := b2.Remove("GH_TOKEN"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	// A different key cannot read the store.
	os.WriteFile(filepath.Join(dir, KeyFile), bytes.Repeat([]byte{1}, 32), 0o600)
	if _, err := newBroker(brokerConfig{Dir: dir}); err == nil || !strings.Contains(err.Error(), "cannot be decrypted") {
		t.Fatalf("wrong key: %v", err)
	}
}

func TestSetValidation(t *testing.T) {
	b := testBroker(t, t.TempDir(), nil)
	for _, req := range []credapi.SecretSetRequest{
		{Name: "", Value: "x"},
		{Name: "bad name", Value: "x"},
		{Name: "A"},
		{Name: "A", Value: "x", Command: "true"},
		{Name: "A", Value: strings.Repeat("x", maxValueBytes+1)},
		{Name: "A", Value: "x", Hosts: []string{"a/b"}},
	} {
		if err := b.Set(req); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Set(%.40q…) = %v, want invalid", req.Name, err)
		}
	}
}

func TestMintResolveAndRefusals(t *testing.T) {
	dir := t.TempDir()
	b := testBroker(t, dir, nil)
	b.Set(credapi.SecretSetRequest{Name: "GH_TOKEN", Value: ghValue})
	b.Set(credapi.SecretSetRequest{Name: "anthropic", Value: "sk-ant-real"})
	res, err := b.Mint(credapi.MintRequest{SandboxID: "p/a", Bindings: []credapi.Binding{
		{Secret: "GH_TOKEN", Hosts: []string{"api.github.com", "uploads.github.com"}, Kind: credapi.KindGitHub},
		{Secret: "anthropic", Hosts: []string{"api.anthropic.com"}, Kind: credapi.KindAnthropic, Env: "MY_KEY"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	env := res.Env
	for _, k := range []string{"NEXUS_CRED_API_GITHUB_COM_TOKEN", "NEXUS_CRED_UPLOADS_GITHUB_COM_TOKEN", "NEXUS_CRED_API_ANTHROPIC_COM_TOKEN", "GH_TOKEN", "ANTHROPIC_AUTH_TOKEN", "MY_KEY"} {
		if !hex64.MatchString(env[k]) {
			t.Fatalf("%s = %q, want 64 hex", k, env[k])
		}
	}
	if env["NEXUS_CRED_API_GITHUB_COM_EXPIRES_AT"] != "2099-12-31T23:59:59Z" {
		t.Fatalf("expires = %q", env["NEXUS_CRED_API_GITHUB_COM_EXPIRES_AT"])
	}
	if env["ANTHROPIC_AUTH_TOKEN"] != env["MY_KEY"] || env["GH_TOKEN"] == env["NEXUS_CRED_API_GITHUB_COM_TOKEN"] {
		t.Fatal("kind/env placeholders wrong")
	}
	// The mitm gets hashes with hosts.
	byHash := map[string][]string{}
	for _, c := range res.Credentials {
		byHash[c.PlaceholderHash] = c.Hosts
	}
	if h := byHash[mitmapi.HashHex(env["GH_TOKEN"])]; len(h) != 2 {
		t.Fatalf("GH_TOKEN bound to %v", h)
	}
	if h := byHash[mitmapi.HashHex(env["NEXUS_CRED_UPLOADS_GITHUB_COM_TOKEN"])]; len(h) != 1 || h[0] != "uploads.github.com" {
		t.Fatalf("uploads placeholder bound to %v", h)
	}

	ctx := context.Background()
	if v, err := b.Resolve(ctx, "p/a", "api.github.com", env["GH_TOKEN"]); err != nil || v != ghValue {
		t.Fatalf("resolve = %q, %v", v, err)
	}
	if v, err := b.Resolve(ctx, "p/a", "uploads.github.com", env["GH_TOKEN"]); err != nil || v != ghValue {
		t.Fatalf("resolve uploads = %q, %v", v, err)
	}
	if v, err := b.Resolve(ctx, "p/a", "API.GITHUB.COM", env["NEXUS_CRED_API_GITHUB_COM_TOKEN"]); err != nil || v != ghValue {
		t.Fatalf("resolve per-host = %q, %v", v, err)
	}
	refusals := []struct{ name, sb, host, p string }{
		{"per-host placeholder on its sibling host", "p/a", "uploads.github.com", env["NEXUS_CRED_API_GITHUB_COM_TOKEN"]},
		{"other sandbox", "p/b", "api.github.com", env["GH_TOKEN"]},
		{"unbound host", "p/a", "evil.example", env["GH_TOKEN"]},
		{"cross-secret host", "p/a", "api.anthropic.com", env["GH_TOKEN"]},
		{"unknown placeholder", "p/a", "api.github.com", strings.Repeat("ab", 32)},
		{"empty", "p/a", "api.github.com", ""},
	}
	for _, r := range refusals {
		v, err := b.Resolve(ctx, r.sb, r.host, r.p)
		if !errors.Is(err, errdefs.ErrRefused) || v != "" {
			t.Errorf("%s: %q, %v; want refused", r.name, v, err)
		}
		if err != nil && (strings.Contains(err.Error(), ghValue) || (r.p != "" && strings.Contains(err.Error(), r.p))) {
			t.Errorf("%s: error carries a secret", r.name)
		}
	}

	// Resolve survives a restart of the broker.
	b2 := testBroker(t, dir, nil)
	if v, err := b2.Resolve(ctx, "p/a", "api.github.com", env["GH_TOKEN"]); err != nil || v != ghValue {
		t.Fatalf("after restart: %q, %v", v, err)
	}
	// Forget at removal.
	if err := b2.Forget("p/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Resolve(ctx, "p/a", "api.github.com", env["GH_TOKEN"]); !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("after forget: %v", err)
	}
	// The first broker notices the other process's write.
	if _, err := b.Resolve(ctx, "p/a", "api.github.com", env["GH_TOKEN"]); !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("stale broker after forget elsewhere: %v", err)
	}
	// Placeholders are not stored in the clear either.
	raw, _ := os.ReadFile(filepath.Join(dir, StoreFile))
	if bytes.Contains(raw, []byte(env["GH_TOKEN"])) {
		t.Fatal("placeholder in the store file")
	}
}

func TestMintErrors(t *testing.T) {
	b := testBroker(t, t.TempDir(), nil)
	b.Set(credapi.SecretSetRequest{Name: "A", Value: "a"})
	b.Set(credapi.SecretSetRequest{Name: "B", Value: "b"})
	cases := []struct {
		req  credapi.MintRequest
		want error
	}{
		{credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{{Secret: "missing", Hosts: []string{"h"}}}}, errdefs.ErrNotFound},
		{credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{{Secret: "A"}}}, errdefs.ErrInvalid},
		{credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{{Secret: "A", Hosts: []string{"h"}, Kind: "weird"}}}, errdefs.ErrInvalid},
		{credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{{Secret: "A", Hosts: []string{"h"}}, {Secret: "B", Hosts: []string{"h"}}}}, errdefs.ErrConflict},
		{credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{{Secret: "A", Hosts: []string{"h1"}, Kind: "github"}, {Secret: "B", Hosts: []string{"h2"}, Kind: "github"}}}, errdefs.ErrConflict},
		{credapi.MintRequest{Bindings: nil}, errdefs.ErrInvalid},
	}
	for i, c := range cases {
		if _, err := b.Mint(c.req); !errors.Is(err, c.want) {
			t.Errorf("case %d: %v, want %v", i, err, c.want)
		}
	}
	// A failed mint changes nothing: the secret's default hosts still work afterwards.
	b.Set(credapi.SecretSetRequest{Name: "C", Value: "c", Hosts: []string{"c.example"}})
	res, err := b.Mint(credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{{Secret: "C"}}})
	if err != nil || res.Env["NEXUS_CRED_C_EXAMPLE_TOKEN"] == "" {
		t.Fatalf("mint with default hosts: %v %v", res.Env, err)
	}
}

// TestRotation: a sandbox keeps the value it was minted with; sandboxes minted after a rotation
// get the new one; re-minting (restart) picks the new value up.
func TestRotation(t *testing.T) {
	b := testBroker(t, t.TempDir(), nil)
	ctx := context.Background()
	b.Set(credapi.SecretSetRequest{Name: "GH_TOKEN", Value: "v1"})
	bind := []credapi.Binding{{Secret: "GH_TOKEN", Hosts: []string{"api.github.com"}, Kind: credapi.KindGitHub}}
	old, err := b.Mint(credapi.MintRequest{SandboxID: "old", Bindings: bind})
	if err != nil {
		t.Fatal(err)
	}
	b.Set(credapi.SecretSetRequest{Name: "GH_TOKEN", Value: "v2"})
	fresh, _ := b.Mint(credapi.MintRequest{SandboxID: "new", Bindings: bind})
	if fresh.Env["GH_TOKEN"] == old.Env["GH_TOKEN"] {
		t.Fatal("a new sandbox got the old placeholder")
	}
	if v, _ := b.Resolve(ctx, "old", "api.github.com", old.Env["GH_TOKEN"]); v != "v1" {
		t.Fatalf("running sandbox resolves %q, want v1 (issued at start)", v)
	}
	if v, _ := b.Resolve(ctx, "new", "api.github.com", fresh.Env["GH_TOKEN"]); v != "v2" {
		t.Fatalf("new sandbox resolves %q, want v2", v)
	}
	restarted, _ := b.Mint(credapi.MintRequest{SandboxID: "old", Bindings: bind})
	if _, err := b.Resolve(ctx, "old", "api.github.com", old.Env["GH_TOKEN"]); !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("the pre-restart placeholder still resolves: %v", err)
	}
	if v, _ := b.Resolve(ctx, "old", "api.github.com", restarted.Env["GH_TOKEN"]); v != "v2" {
		t.Fatalf("restarted sandbox resolves %q, want v2", v)
	}
	// Removing the secret does not break a running sandbox.
	b.Remove("GH_TOKEN")
	if v, _ := b.Resolve(ctx, "new", "api.github.com", fresh.Env["GH_TOKEN"]); v != "v2" {
		t.Fatalf("after rm: %q", v)
	}
}

func TestCommandSecret(t *testing.T) {
	dir := t.TempDir()
	counter := filepath.Join(dir, "runs")
	logs := &testutil.SyncBuffer{}
	b, err := newBroker(brokerConfig{Dir: filepath.Join(dir, "s"), Logger: zerolog.New(logs), CommandTimeout: 300 * time.Millisecond, CommandCacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b.Set(credapi.SecretSetRequest{Name: "gh", Command: "echo run >> " + counter + "; printf '  cmd-token-777\\n\\n'"})
	b.Set(credapi.SecretSetRequest{Name: "fail", Command: "echo LEAKYOUTPUT; echo LEAKYERR >&2; exit 3"})
	b.Set(credapi.SecretSetRequest{Name: "slow", Command: "sleep 10"})
	b.Set(credapi.SecretSetRequest{Name: "empty", Command: "true"})
	res, err := b.Mint(credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{
		{Secret: "gh", Hosts: []string{"a.example"}},
		{Secret: "fail", Hosts: []string{"b.example"}},
		{Secret: "slow", Hosts: []string{"c.example"}},
		{Secret: "empty", Hosts: []string{"d.example"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		v, err := b.Resolve(ctx, "s", "a.example", res.Env["NEXUS_CRED_A_EXAMPLE_TOKEN"])
		if err != nil || v != "cmd-token-777" {
			t.Fatalf("command secret = %q, %v", v, err)
		}
	}
	if runs, _ := os.ReadFile(counter); strings.Count(string(runs), "run") != 1 {
		t.Fatalf("command ran %d times, want 1 (cached)", strings.Count(string(runs), "run"))
	}
	_, err = b.Resolve(ctx, "s", "b.example", res.Env["NEXUS_CRED_B_EXAMPLE_TOKEN"])
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "exit code 3") || strings.Contains(err.Error(), "LEAKY") {
		t.Fatalf("failing command: %v", err)
	}
	start := time.Now()
	_, err = b.Resolve(ctx, "s", "c.example", res.Env["NEXUS_CRED_C_EXAMPLE_TOKEN"])
	if !errors.Is(err, errdefs.ErrUnavailable) || time.Since(start) > 5*time.Second {
		t.Fatalf("slow command: %v after %s", err, time.Since(start))
	}
	if _, err = b.Resolve(ctx, "s", "d.example", res.Env["NEXUS_CRED_D_EXAMPLE_TOKEN"]); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("empty command: %v", err)
	}
	if l := logs.String(); strings.Contains(l, "cmd-token-777") || strings.Contains(l, "LEAKY") {
		t.Fatalf("logs carry command output: %s", l)
	}
}

// TestNoSecretInLogs captures every log line of a full run and checks that no value and no
// placeholder appears in them.
func TestNoSecretInLogs(t *testing.T) {
	logs := &testutil.SyncBuffer{}
	b := testBroker(t, t.TempDir(), logs)
	ctx := context.Background()
	b.Set(credapi.SecretSetRequest{Name: "GH_TOKEN", Value: ghValue})
	res, err := b.Mint(credapi.MintRequest{SandboxID: "s", Bindings: []credapi.Binding{{Secret: "GH_TOKEN", Hosts: []string{"api.github.com"}, Kind: "github"}}})
	if err != nil {
		t.Fatal(err)
	}
	b.Resolve(ctx, "s", "api.github.com", res.Env["GH_TOKEN"])
	b.Resolve(ctx, "x", "api.github.com", res.Env["GH_TOKEN"])
	b.List()
	b.Forget("s")
	b.Remove("GH_TOKEN")
	l := logs.String()
	if l == "" {
		t.Fatal("no logs captured")
	}
	secrets := []string{ghValue}
	for _, v := range res.Env {
		if hex64.MatchString(v) {
			secrets = append(secrets, v)
		}
	}
	for _, s := range secrets {
		if strings.Contains(l, s) {
			t.Fatalf("logs contain a secret: %s", l)
		}
	}
}
