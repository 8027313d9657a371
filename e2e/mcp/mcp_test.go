// Package mcp_test drives `nexus mcp` over stdio against a whole nexus stack (`nexus up` in a
// temp home) with real microVMs: with the mcp-go stdio client, with raw pipes (stdout carries
// only protocol) and with the official @modelcontextprotocol/inspector CLI from npm.
package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/IniZio/nexus/internal/testutil"
)

var stack *testutil.Stack

func TestMain(m *testing.M) { testutil.Main(m, &stack) }

var miniOnce sync.Once

// needMini builds the nexus-mini image once (seconds).
func needMini(t *testing.T) {
	miniOnce.Do(func() { stack.MustNexus(t, "image", "build", "nexus-mini") })
}

// mcpClient starts `nexus mcp` as a child process and initializes an MCP session with it.
func mcpClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.NewStdioMCPClient(stack.Bin, stack.Env, "mcp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "nexus-e2e", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	return c
}

func call(t *testing.T, c *client.Client, tool string, args map[string]any, out any) *mcpgo.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req := mcpgo.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = tool, args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if out != nil {
		if res.IsError {
			t.Fatalf("%s: tool error: %v", tool, res.Content)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %s: %v", tool, b, err)
		}
	}
	return res
}

type execResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutOmitted   int64  `json:"stdout_omitted"`
	Sandbox         string `json:"sandbox"`
}

type listResult struct {
	Sandboxes []struct {
		Name string `json:"name"`
	} `json:"sandboxes"`
}

func TestSandboxRun(t *testing.T) {
	needMini(t)
	c := mcpClient(t)
	var r execResult
	start := time.Now()
	call(t, c, "sandbox_run", map[string]any{"image": "nexus-mini", "argv": []string{"sh", "-c", "echo hi; echo err >&2; exit 3"}}, &r)
	t.Logf("sandbox_run took %s", time.Since(start))
	if r.ExitCode != 3 || r.Stdout != "hi\n" || r.Stderr != "err\n" || r.StdoutBytes != 3 || r.StderrBytes != 4 {
		t.Errorf("run: %+v", r)
	}
	var list listResult
	call(t, c, "sandbox_list", map[string]any{}, &list)
	for _, s := range list.Sandboxes {
		if s.Name == r.Sandbox {
			t.Errorf("sandbox %s still listed after sandbox_run", s.Name)
		}
	}
	if _, err := os.Stat(stack.Home.Sandboxes()); err == nil {
		entries, _ := os.ReadDir(stack.Home.Sandboxes())
		for _, e := range entries {
			t.Logf("sandbox dir left: %s", e.Name())
		}
	}
}

func TestSandboxExecTruncates(t *testing.T) {
	needMini(t)
	c := mcpClient(t)
	// sandbox_create mints a record (the spec's words); sandbox_start boots it.
	var sb struct {
		State string `json:"state"`
	}
	call(t, c, "sandbox_create", map[string]any{"name": "trunc", "image": "nexus-mini", "labels": map[string]string{"nexus-test": "mcp"}}, &sb)
	t.Cleanup(func() { call(t, c, "sandbox_remove", map[string]any{"name": "trunc"}, nil) })
	if sb.State != "created" {
		t.Fatalf("sandbox_create: state %q, want created", sb.State)
	}
	call(t, c, "sandbox_start", map[string]any{"sandbox": "trunc"}, &sb)
	if sb.State != "running" {
		t.Fatalf("sandbox_start: state %q, want running", sb.State)
	}
	// Over 64 KiB a stream keeps its first and last 32 KiB, and says how much it left out.
	var r execResult
	call(t, c, "sandbox_exec", map[string]any{"name": "trunc", "argv": []string{"sh", "-c",
		"head -c 102400 /dev/zero | tr '\\0' a; printf END; echo small >&2"}}, &r)
	marker := fmt.Sprintf("\n[nexus: %d bytes omitted]\n", 102403-(64<<10))
	if r.ExitCode != 0 || r.StdoutBytes != 102403 || !r.StdoutTruncated || r.StdoutOmitted != 102403-(64<<10) ||
		!strings.HasSuffix(r.Stdout, "aEND") || !strings.Contains(r.Stdout, marker) || len(r.Stdout) != 64<<10+len(marker) ||
		r.Stderr != "small\n" || r.StderrTruncated {
		t.Errorf("exec: code %d stdout %d/%d truncated %v omitted %d stderr %q", r.ExitCode, len(r.Stdout), r.StdoutBytes, r.StdoutTruncated, r.StdoutOmitted, r.Stderr)
	}
	res := call(t, c, "sandbox_exec", map[string]any{"name": "nope", "argv": []string{"true"}}, nil)
	if !res.IsError {
		t.Error("exec in a missing sandbox is not a tool error")
	}
}

// Stdout carries only JSON-RPC; logs stay on stderr.
func TestStdoutIsProtocolOnly(t *testing.T) {
	cmd := exec.Command(stack.Bin, "mcp", "--log-level", "debug")
	cmd.Env = stack.Env
	cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/list"}
{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sandbox_list","arguments":{}}}
{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"sandbox_remove","arguments":{"name":"ghost"}}}
`)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	seen := map[float64]map[string]any{}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil || m["jsonrpc"] != "2.0" {
			t.Errorf("not JSON-RPC on stdout: %q", sc.Text())
			continue
		}
		if id, ok := m["id"].(float64); ok {
			seen[id] = m
		}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("nexus mcp exited with %v after stdin closed; stderr: %s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("nexus mcp did not exit when stdin closed")
	}
	for id := 1.0; id <= 4; id++ {
		if seen[id] == nil || seen[id]["error"] != nil {
			t.Errorf("response %v: %v", id, seen[id])
		}
	}
	if res, _ := seen[4]["result"].(map[string]any); res["isError"] != true {
		t.Errorf("sandbox_remove of a missing sandbox: %v", seen[4])
	}
}

// The official inspector CLI from npm lists and calls the tools.
func TestInspectorCLI(t *testing.T) {
	npx, err := exec.LookPath("npx")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI needs npx (nodejs, npm) for the MCP inspector")
		}
		t.Skip("npx not installed")
	}
	cache := filepath.Join(testutil.CacheDir(), "npm")
	os.MkdirAll(cache, 0o755)
	inspector := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// The inspector starts the server with a minimal environment: pass ours explicitly.
		full := []string{"-y", "@modelcontextprotocol/inspector", "--cli"}
		for _, kv := range stack.Env {
			if k, _, _ := strings.Cut(kv, "="); k == "HOME" || k == "NEXUS_HOME" || k == "NEXUS_CACHE" || k == "NEXUS_BUS_PORT" {
				full = append(full, "-e", kv)
			}
		}
		full = append(full, stack.Bin, "mcp")
		full = append(full, args...)
		cmd := exec.CommandContext(ctx, npx, full...)
		cmd.Env = append(os.Environ(), "npm_config_cache="+cache, "npm_config_update_notifier=false")
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("inspector %v: %v\n%s\n%s", args, err, out, stderr)
		}
		return string(out)
	}
	var tools struct {
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	if err := json.Unmarshal([]byte(inspector("--method", "tools/list")), &tools); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tl := range tools.Tools {
		names[tl.Name] = true
	}
	for _, n := range []string{"sandbox_create", "sandbox_list", "sandbox_start", "sandbox_stop", "sandbox_pause", "sandbox_resume",
		"sandbox_remove", "sandbox_exec", "sandbox_run", "delegate_worktree_create", "delegate_agent_dispatch", "delegate_agent_poll",
		"delegate_teardown", "sandbox_logs", "sandbox_ports", "egress_audit"} {
		if !names[n] {
			t.Errorf("inspector: tool %s missing", n)
		}
	}
	var res struct {
		StructuredContent struct {
			Sandboxes []any `json:"sandboxes"`
		} `json:"structuredContent"`
		IsError bool `json:"isError"`
	}
	out := inspector("--method", "tools/call", "--tool-name", "sandbox_list")
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.IsError || res.StructuredContent.Sandboxes == nil {
		t.Errorf("inspector tools/call sandbox_list: %v: %s", err, out)
	}
}
