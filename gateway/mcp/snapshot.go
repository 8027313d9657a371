package mcp

import (
	"context"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Snapshot and fork tools.
const (
	ToolSandboxSnapshot = "sandbox_snapshot"
	ToolSandboxFork     = "sandbox_fork"
)

func (s *Server) snapshotTools() []toolDef {
	return []toolDef{
		{tool: mcpgo.NewTool(ToolSandboxSnapshot,
			mcpgo.WithDescription("Snapshot a running sandbox (memory, device state, disk and named volumes) under a name, for sandbox_fork. "+
				"The sandbox is paused for the copy and resumes. Refused on a sandbox with live mounts (the error names each host→guest pair)."),
			nameProp(),
			mcpgo.WithString("snapshot", mcpgo.Required(), mcpgo.Description("snapshot name: 1-63 of a-z 0-9 - _")),
			hints{title: "Snapshot sandbox"}.opt(), mcpgo.WithOutputSchema[api.Snapshot](),
		), handler: s.sandboxSnapshot},
		{tool: mcpgo.NewTool(ToolSandboxFork,
			mcpgo.WithDescription("Boot a new sandbox from a snapshot in a fraction of a cold boot: processes that ran in the parent keep running, "+
				"memory is shared copy-on-write, and the fork gets its own hostname, network, placeholders and clock. Returns the new sandbox record."),
			mcpgo.WithString("snapshot", mcpgo.Required(), mcpgo.Description("snapshot name (or a sandbox name: it is snapshotted first as <name>-base)")),
			mcpgo.WithString("name", mcpgo.Required(), mcpgo.Description("name of the new sandbox: [project/]name")),
			mcpgo.WithObject("labels", mcpgo.Description("labels key=value for selection"), mcpgo.AdditionalProperties(map[string]any{"type": "string"})),
			hints{title: "Fork sandbox from a snapshot"}.opt(), mcpgo.WithOutputSchema[api.Sandbox](),
		), handler: s.sandboxFork},
	}
}

type snapshotArgs struct {
	Name     string `json:"name"`
	Snapshot string `json:"snapshot"`
}

func (s *Server) sandboxSnapshot(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a snapshotArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Name == "" || a.Snapshot == "" {
		return nil, errdefs.Invalid("name and snapshot are required")
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, api.SnapshotTimeout)
	defer cancel()
	return c.SnapshotCreate(cctx, api.SnapshotCreateRequest{Sandbox: a.Name, Snapshot: a.Snapshot})
}

type forkArgs struct {
	Snapshot string            `json:"snapshot"`
	Name     string            `json:"name"`
	Labels   map[string]string `json:"labels"`
}

func (s *Server) sandboxFork(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a forkArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Snapshot == "" || a.Name == "" {
		return nil, errdefs.Invalid("snapshot and name are required")
	}
	labels, err := labelPairs(a.Labels)
	if err != nil {
		return nil, err
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, api.CreateTimeout)
	defer cancel()
	return c.Fork(cctx, api.ForkRequest{Source: a.Snapshot, Name: a.Name, Labels: labels})
}
