package snapshot_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// TestMCPSnapshotFork drives sandbox_snapshot and sandbox_fork through `nexus mcp` over stdio.
func TestMCPSnapshotFork(t *testing.T) {
	create(t, "mcp/parent")
	stack.MustNexus(t, "exec", "mcp/parent", "--", "sh", "-c", "echo from-parent > /root/origin")
	c, err := client.NewStdioMCPClient(stack.Bin, stack.Env, "mcp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "nexus-e2e", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	call := func(tool string, args map[string]any, out any) *mcpgo.CallToolResult {
		t.Helper()
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
	var snap api.Snapshot
	call("sandbox_snapshot", map[string]any{"name": "mcp/parent", "snapshot": "mcp-snap"}, &snap)
	t.Cleanup(func() { stack.Nexus(t, "snapshot", "rm", "mcp-snap") })
	if snap.Name != "mcp-snap" || snap.Sandbox != "mcp/parent" || snap.RAMBytes != 256<<20 {
		t.Fatalf("sandbox_snapshot: %+v", snap)
	}
	var sb api.Sandbox
	call("sandbox_fork", map[string]any{"snapshot": "mcp-snap", "name": "mcp/child", "labels": map[string]any{"via": "mcp"}}, &sb)
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", "mcp/child") })
	if sb.Name != "mcp/child" || sb.State != api.StateRunning || sb.Labels["via"] != "mcp" {
		t.Fatalf("sandbox_fork: %+v", sb)
	}
	if out := stack.MustNexus(t, "exec", "mcp/child", "--", "cat", "/root/origin"); out != "from-parent\n" {
		t.Fatalf("fork's /root/origin: %q", out)
	}
	res := call("sandbox_fork", map[string]any{"snapshot": "no-such", "name": "mcp/other"}, nil)
	if !res.IsError || !strings.Contains(textOf(res), "no snapshot or sandbox named no-such") {
		t.Fatalf("fork of a missing snapshot: %+v", res.Content)
	}
}

func textOf(res *mcpgo.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(mcpgo.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
