package mcp

import (
	"context"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Live egress tools (issue 26). The gateway refuses them unless the stack runs with
// --mcp-egress, and never lets them open a private address or a host a secret is bound to.
const (
	ToolEgressAllow  = "egress_allow"
	ToolEgressRevoke = "egress_revoke"
)

// EgressAllowDescription is egress_allow's description.
const EgressAllowDescription = "Allow one more host on a sandbox's curated egress, running or not, optionally for a while (for: 30m); new connections " +
	"may use it within a second. Off unless the operator started nexus with --mcp-egress; never opens a private address or a host a secret is " +
	"bound to, nor anything on a sandbox with egress none or allow-all. egress_audit shows what was refused and by which rule."

type egressArgs struct {
	Name string `json:"name"`
	Host string `json:"host"`
	For  string `json:"for"`
}

func (s *Server) egressTools() []toolDef {
	return []toolDef{
		{tool: mcpgo.NewTool(ToolEgressAllow,
			mcpgo.WithDescription(EgressAllowDescription),
			nameProp(),
			mcpgo.WithString("host", mcpgo.Required(), mcpgo.Description("host[:port,…] to allow (bare host: 443 and 80); *.domain for every name under it")),
			mcpgo.WithString("for", mcpgo.Description("end the grant on its own after this long, e.g. 30m (default: until egress_revoke)")),
			hints{title: "Allow a host on a sandbox", idempotent: true}.opt(), mcpgo.WithOutputSchema[api.EgressChange](),
		), handler: s.egressAllow},
		{tool: mcpgo.NewTool(ToolEgressRevoke,
			mcpgo.WithDescription("Remove a grant made with egress_allow (or nexus egress allow/deny); open connections it no longer allows are closed. "+
				"Off unless the operator started nexus with --mcp-egress."),
			nameProp(),
			mcpgo.WithString("host", mcpgo.Required(), mcpgo.Description("host of the grant (host:port,… removes only that rule)")),
			hints{title: "Revoke a host grant"}.opt(), mcpgo.WithOutputSchema[api.EgressChange](),
		), handler: s.egressRevoke},
	}
}

func (s *Server) egressChange(ctx context.Context, req mcpgo.CallToolRequest, call func(*api.Client, api.EgressChangeRequest) (api.EgressChange, error)) (any, error) {
	var a egressArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Name == "" || a.Host == "" {
		return nil, errdefs.Invalid("name and host are required")
	}
	r := api.EgressChangeRequest{Name: a.Name, Host: a.Host, By: "mcp client", Via: "mcp"}
	if a.For != "" {
		d, err := time.ParseDuration(a.For)
		if err != nil || d <= 0 {
			return nil, errdefs.Invalid("invalid for %q: use a duration like 30m or 2h", a.For)
		}
		r.For = d
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	return call(c, r)
}

func (s *Server) egressAllow(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	return s.egressChange(ctx, req, func(c *api.Client, r api.EgressChangeRequest) (api.EgressChange, error) { return c.EgressAllow(ctx, r) })
}

func (s *Server) egressRevoke(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	return s.egressChange(ctx, req, func(c *api.Client, r api.EgressChangeRequest) (api.EgressChange, error) {
		return c.EgressRevoke(ctx, r)
	})
}
