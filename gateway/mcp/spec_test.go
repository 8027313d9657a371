package mcp

import (
	"context"
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// TestCreateMintsARecord: sandbox_create leaves the sandbox created, as the spec's table says
// ("Mint a new sandbox record"); sandbox_start boots it; start: true does both in one call.
func TestCreateMintsARecord(t *testing.T) {
	st := newStack(t, true)
	var sb api.Sandbox
	st.ok(t, "sandbox_create", map[string]any{"name": "rec", "image": "nexus-mini"}, &sb)
	if sb.State != api.StateCreated || st.vmm.running() != 0 {
		t.Fatalf("create: state %s, %d VMs; want created, none", sb.State, st.vmm.running())
	}
	var ar applyResult
	st.ok(t, "sandbox_start", map[string]any{"name": "rec"}, &ar)
	if ar.State != "running" || st.vmm.running() != 1 {
		t.Errorf("start: %+v, %d VMs", ar, st.vmm.running())
	}
	st.ok(t, "sandbox_create", map[string]any{"name": "now", "image": "nexus-mini", "start": true}, &sb)
	if sb.State != api.StateRunning || st.vmm.running() != 2 {
		t.Errorf("create with start: state %s, %d VMs", sb.State, st.vmm.running())
	}
	// The sandbox is named "name" everywhere; "sandbox" is an alias.
	st.ok(t, "sandbox_get", map[string]any{"sandbox": "rec"}, &sb)
	if sb.Name != "default/rec" {
		t.Errorf("get by alias: %+v", sb.Name)
	}
	var logs LogsResult
	st.ok(t, "sandbox_logs", map[string]any{"sandbox": "rec", "name": "default/rec"}, &logs)
}

// TestArgumentsInUserTerms: unknown arguments are refused by name, a wrong type says what was
// wanted, and no message speaks Go or CLI flags.
func TestArgumentsInUserTerms(t *testing.T) {
	st := newStack(t, false)
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"sandbox_create", map[string]any{"name": "a", "bogus": 1}, `unknown argument "bogus": sandbox_create takes name, `},
		{"sandbox_exec", map[string]any{"name": "a", "argv": []string{"true"}, "cwd": "/"}, `unknown argument "cwd"`},
		{"sandbox_create", map[string]any{"name": "a", "memory": "lots"}, `invalid argument memory: want a whole number, got the string "lots"`},
		{"sandbox_create", map[string]any{"name": "a", "memory": 1.5}, `invalid argument memory: want a whole number, got 1.5`},
		{"sandbox_exec", map[string]any{"name": "a", "argv": "ls -la"}, `invalid argument argv: want a list of strings`},
		{"sandbox_create", map[string]any{"name": "a", "labels": map[string]any{"k": 1}}, `invalid argument labels: want an object of string values`},
		{"sandbox_get", map[string]any{}, `name is required`},
		{"sandbox_get", map[string]any{"name": "a", "sandbox": "b"}, `name and its alias sandbox disagree`},
		{"sandbox_create", map[string]any{"name": "a", "memory": 10}, `memory 10 is below the guest's minimum`},
		{"sandbox_create", map[string]any{"name": "a", "egress": "sometimes"}, `invalid egress "sometimes"`},
		{"sandbox_create", map[string]any{"name": "a", "allowed_hosts": []string{"bad host"}}, `invalid allowed_hosts "bad host"`},
	} {
		msg, _ := st.fails(t, c.tool, c.args)
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s %v: %q, want %q", c.tool, c.args, msg, c.want)
		}
		for _, bad := range []string{"json:", "Go struct", "unmarshal", " --"} {
			if strings.Contains(msg, bad) {
				t.Errorf("%s %v: %q says %q", c.tool, c.args, msg, bad)
			}
		}
	}
}

// TestAnnotations: every tool has a title and an output schema, and its hints say what it
// does: the readers are read-only and not destructive.
func TestAnnotations(t *testing.T) {
	st := newStack(t, false)
	res, err := st.client.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	readers := map[string]bool{"sandbox_list": true, "sandbox_get": true, "sandbox_logs": true, "sandbox_ports": true,
		"egress_audit": true, "delegate_agent_poll": true, "egress_requests": true}
	destructive := map[string]bool{"sandbox_remove": true, "sandbox_stop": true, "sandbox_exec": true, "delegate_teardown": true}
	for _, tool := range res.Tools {
		a := tool.Annotations
		if tool.Title == "" || a.Title != tool.Title {
			t.Errorf("%s: title %q / %q", tool.Name, tool.Title, a.Title)
		}
		if tool.OutputSchema.Type != "object" || len(tool.OutputSchema.Properties) == 0 {
			t.Errorf("%s: no output schema", tool.Name)
		}
		if a.ReadOnlyHint == nil || a.DestructiveHint == nil || a.IdempotentHint == nil || a.OpenWorldHint == nil {
			t.Errorf("%s: unset hints %+v", tool.Name, a)
			continue
		}
		if *a.ReadOnlyHint != readers[tool.Name] {
			t.Errorf("%s: readOnlyHint %v", tool.Name, *a.ReadOnlyHint)
		}
		if readers[tool.Name] && (!*a.IdempotentHint || *a.OpenWorldHint) {
			t.Errorf("%s: a reader is idempotent and closed-world: %+v", tool.Name, a)
		}
		if *a.DestructiveHint != destructive[tool.Name] {
			t.Errorf("%s: destructiveHint %v", tool.Name, *a.DestructiveHint)
		}
	}
	for _, name := range []string{"sandbox_start", "sandbox_stop", "sandbox_pause", "sandbox_resume", "sandbox_remove"} {
		for _, tool := range res.Tools {
			if tool.Name == name && !*tool.Annotations.IdempotentHint {
				t.Errorf("%s: not idempotent", name)
			}
		}
	}
}

func TestUserTermsKeepsQuotedCommands(t *testing.T) {
	got := userTerms("invalid --secret X: only `nexus create --secret X@h` can bind it; use rm --force")
	if want := "invalid secrets X: only `nexus create --secret X@h` can bind it; pass force: true"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}
