package mcp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

// claudeVersion is the Claude Code CLI the plugin test installs: the last release that is a
// node script (cli.js, engines node >=18: Debian 12's nodejs 18 runs it); later ones are a native
// binary fetched as a platform package, and from 2.1.3xx they need node 22.
const claudeVersion = "2.1.112"

// claudeCLI installs the pinned Claude Code CLI under the shared cache (once; later runs reuse
// it) and returns its path.
func claudeCLI(t *testing.T) string {
	t.Helper()
	npm, err := exec.LookPath("npm")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI needs npm (make deps installs nodejs and npm) for the Claude Code plugin test")
		}
		t.Skip("npm not installed")
	}
	out, err := exec.Command("node", "--version").Output()
	major, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(strings.TrimSpace(string(out)), ".", 2)[0], "v"))
	if err != nil || major < 18 {
		t.Fatalf("claude-code %s needs node >= 18; node --version: %q %v", claudeVersion, out, err)
	}
	dir := filepath.Join(testutil.CacheDir(), "claude-code-"+claudeVersion)
	bin := filepath.Join(dir, "node_modules", ".bin", "claude")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command(npm, "install", "--no-audit", "--no-fund", "--prefix", dir, "@anthropic-ai/claude-code@"+claudeVersion)
	cmd.Env = append(os.Environ(), "npm_config_cache="+filepath.Join(testutil.CacheDir(), "npm"), "npm_config_update_notifier=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("npm install claude-code@%s: %v\n%s", claudeVersion, err, out)
	}
	return bin
}

// repoRoot is the nexus checkout: the plugin's marketplace is the repository itself.
func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, ".claude-plugin", "marketplace.json")); err != nil {
		t.Fatal(err)
	}
	return root
}

// offline runs argv without a network when it can (a network namespace of its own, as root),
// so nothing the CLI does reaches the internet.
func offline(argv ...string) []string {
	if u, err := exec.LookPath("unshare"); err == nil && os.Geteuid() == 0 && exec.Command(u, "-n", "true").Run() == nil {
		return append([]string{u, "-n"}, argv...)
	}
	return argv
}

// TestClaudePlugin installs the repository's Claude Code plugin with the real claude CLI, in a
// temporary HOME and offline, as the README says (`claude plugin marketplace add`, `claude
// plugin install nexus@nexus`), and checks that claude connects to `nexus mcp` (found on PATH)
// and lists its tools, the nexus skill and the commands.
func TestClaudePlugin(t *testing.T) {
	claude := claudeCLI(t)
	root := repoRoot(t)
	home := t.TempDir()
	env := append(slices.Clone(stack.Env), "HOME="+home, "PATH="+filepath.Dir(stack.Bin)+":"+os.Getenv("PATH"),
		"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1")
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		argv := offline(append([]string{claude}, args...)...)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env, cmd.Dir = env, home
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("claude %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("plugin", "marketplace", "add", root)
	run("plugin", "install", "nexus@nexus")
	if out := run("mcp", "list"); !strings.Contains(out, "plugin:nexus:nexus") || !strings.Contains(out, "Connected") || strings.Contains(out, "Failed") {
		t.Fatalf("claude mcp list does not show the plugin's nexus server connected:\n%s", out)
	}

	// A print-mode session's first message lists what the session has: read it, then stop the
	// session (it has no API to talk to).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := offline(claude, "-p", "hello", "--output-format", "stream-json", "--verbose", "--max-turns", "1")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = append(slices.Clone(env), "ANTHROPIC_API_KEY=sk-ant-test-offline"), home
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var init struct {
		Type          string   `json:"type"`
		Subtype       string   `json:"subtype"`
		Tools         []string `json:"tools"`
		SlashCommands []string `json:"slash_commands"`
		Skills        []string `json:"skills"`
		MCPServers    []struct {
			Name   string `json:"name"`
			Status string `json:"status"`
		} `json:"mcp_servers"`
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		if json.Unmarshal(sc.Bytes(), &init) == nil && init.Type == "system" && init.Subtype == "init" {
			break
		}
	}
	if init.Subtype != "init" {
		t.Fatalf("no init message from claude -p: %v\n%s", sc.Err(), stderr.String())
	}
	for _, c := range []string{"nexus:task", "nexus:run", "nexus:teardown", "nexus:delegate"} {
		if !slices.Contains(init.SlashCommands, c) {
			t.Errorf("command /%s not listed: %v", c, init.SlashCommands)
		}
	}
	if !slices.Contains(init.Skills, "nexus:nexus") {
		t.Errorf("skill nexus not listed: %v", init.Skills)
	}
	for _, tool := range []string{"sandbox_create", "sandbox_get", "sandbox_exec", "egress_audit", "delegate_worktree_create"} {
		if !slices.Contains(init.Tools, "mcp__plugin_nexus_nexus__"+tool) {
			t.Errorf("tool %s not listed: %v", tool, init.Tools)
		}
	}
	if len(init.MCPServers) != 1 || init.MCPServers[0].Name != "plugin:nexus:nexus" || init.MCPServers[0].Status != "connected" {
		t.Errorf("mcp servers: %+v", init.MCPServers)
	}
}

// TestClaudePluginWithoutNexus: the plugin's launcher says clearly that nexus is missing, and
// how to install it, instead of a bare "failed".
func TestClaudePluginWithoutNexus(t *testing.T) {
	launcher := filepath.Join(repoRoot(t), "plugins", "nexus", "bin", "nexus-mcp")
	for _, env := range [][]string{
		{"PATH=/nonexistent", "HOME=" + t.TempDir(), "NEXUS_BIN=/nonexistent/nexus"},
		{"PATH=" + t.TempDir(), "HOME=" + t.TempDir()},
	} {
		if !strings.HasPrefix(env[0], "PATH=/nonexistent") {
			if _, err := os.Stat("/usr/local/bin/nexus"); err == nil {
				continue // installed on this machine: the launcher rightly finds it
			}
			if _, err := os.Stat("/usr/bin/nexus"); err == nil {
				continue
			}
		}
		cmd := exec.Command("/bin/sh", launcher)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 127 || !strings.Contains(string(out), "nexus binary is not on PATH") ||
			!strings.Contains(string(out), "make install") {
			t.Errorf("launcher with %v: %v: %s", env, err, out)
		}
	}
	// With nexus on PATH it is `nexus mcp`.
	cmd := exec.Command("/bin/sh", launcher)
	cmd.Env = append(slices.Clone(stack.Env), "PATH="+filepath.Dir(stack.Bin)+":/usr/bin:/bin")
	cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}` + "\n")
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), `"serverInfo"`) {
		t.Errorf("launcher with nexus on PATH: %v: %s", err, out)
	}
}
