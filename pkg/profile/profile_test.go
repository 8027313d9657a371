package profile

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
)

func TestDefaultIsClaudeCode(t *testing.T) {
	p := Default()
	if p.Name != "claude-code" {
		t.Fatalf("default profile = %q, want claude-code", p.Name)
	}
	if !p.CredDirLiveMount || p.CredDir != ".claude" || p.GuestCredPath != "/root/.claude" {
		t.Fatalf("claude-code credential delivery = %+v", p)
	}
	if !slices.Equal(p.EgressHosts, []string{"api.anthropic.com", "platform.claude.com"}) {
		t.Fatalf("claude-code egress = %v", p.EgressHosts)
	}
	if !slices.Contains(p.CACertEnvVars, "NODE_EXTRA_CA_CERTS") {
		t.Fatalf("claude-code CA env vars = %v", p.CACertEnvVars)
	}
	for _, k := range []string{"DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"} {
		if p.GuestEnv[k] != "1" {
			t.Errorf("claude-code GuestEnv[%s] = %q, want 1", k, p.GuestEnv[k])
		}
	}
	want := []string{"/usr/local/bin/claude", "--permission-mode", "auto"}
	if !slices.Equal(p.LaunchCommand, want) {
		t.Fatalf("launch = %v, want %v", p.LaunchCommand, want)
	}
	if len(p.Secrets) != 0 {
		t.Fatalf("claude-code must not seed placeholders, has %v", p.Secrets)
	}
}

func TestCodexBrokersOpenAIKey(t *testing.T) {
	p, err := Get("codex")
	if err != nil {
		t.Fatal(err)
	}
	if p.CredDirLiveMount {
		t.Fatal("codex must use placeholders, not a live mount")
	}
	if len(p.Secrets) != 1 || p.Secrets[0].Env != "OPENAI_API_KEY" || !slices.Equal(p.Secrets[0].Hosts, []string{"api.openai.com"}) {
		t.Fatalf("codex secrets = %+v", p.Secrets)
	}
	for _, h := range p.Secrets[0].Hosts {
		if !slices.Contains(p.EgressHosts, h) {
			t.Errorf("secret host %s not in egress hosts %v", h, p.EgressHosts)
		}
	}
	if !slices.Contains(p.CACertEnvVars, "SSL_CERT_FILE") || !slices.Contains(p.CACertEnvVars, "NODE_EXTRA_CA_CERTS") {
		t.Fatalf("codex CA env vars = %v", p.CACertEnvVars)
	}
}

func TestUnknownProfileRefused(t *testing.T) {
	_, err := Get("claude")
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("err = %v, want invalid", err)
	}
	msg := err.Error()
	for _, n := range []string{`"claude"`, "claude-code", "codex"} {
		if !strings.Contains(msg, n) {
			t.Errorf("error %q does not mention %s", msg, n)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error is not one line: %q", msg)
	}
}

func TestGetReturnsCopies(t *testing.T) {
	p := Default()
	p.EgressHosts[0] = "evil.example"
	p.GuestEnv["X"] = "y"
	p.LaunchCommand[0] = "/bin/sh"
	q := Default()
	if q.EgressHosts[0] != "api.anthropic.com" || q.GuestEnv["X"] != "" || q.LaunchCommand[0] != "/usr/local/bin/claude" {
		t.Fatal("mutating a returned profile changed the registry")
	}
}

// No profile may ever carry a permission bypass, in any field.
func TestNoPermissionBypass(t *testing.T) {
	for _, p := range All() {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for _, bad := range []string{"--dangerously-skip-permissions", "dangerously-skip-permissions", "bypassPermissions", "skipDangerousModePermissionPrompt"} {
			if strings.Contains(s, bad) {
				t.Errorf("profile %s carries %s", p.Name, bad)
			}
		}
		if len(p.LaunchCommand) == 0 || !strings.HasPrefix(p.LaunchCommand[0], "/") {
			t.Errorf("profile %s: launch command must be an absolute path, got %v", p.Name, p.LaunchCommand)
		}
	}
}

func TestNamesSortedAndUnique(t *testing.T) {
	names := Names()
	if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
		t.Fatalf("names = %v", names)
	}
	if !slices.Contains(names, DefaultName) {
		t.Fatalf("default %s not registered", DefaultName)
	}
}
