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
	ToolEgressAllow    = "egress_allow"
	ToolEgressRevoke   = "egress_revoke"
	ToolEgressRequests = "egress_requests"
	ToolEgressApprove  = "egress_approve"
)

// RequestsResult lists the pending requests of ask-mode sandboxes.
type RequestsResult struct {
	Requests []api.EgressRequest `json:"requests"`
}

type approveArgs struct {
	ID    string `json:"id"`
	For   string `json:"for"`
	Ports []int  `json:"ports"`
}

// EgressAllowDescription is egress_allow's description.
const EgressAllowDescription = "Allow one more host on a sandbox's curated egress, running or not, optionally for a while (for: 30m); new connections " +
	"may use it within a second. Off unless the operator started nexus with --mcp-egress; never opens a private address or a host a secret is " +
	"bound to, nor anything on a sandbox with egress none or allow-all. egress_audit shows what was refused and by which rule; inside the sandbox, " +
	"`nexus-why` shows the same for that sandbox alone, with what would allow each."

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
		{tool: mcpgo.NewTool(ToolEgressRequests,
			mcpgo.WithDescription("Pending egress requests of sandboxes created with egress ask mode: hosts a guest tried to reach that are not allowed "+
				"(id, sandbox, host, port, first and last seen, count, the guest process that asked, and the reason the agent inside gave with "+
				"`nexus-why request`: both reported by the guest, not to be trusted). Answer one with egress_approve, or the operator with nexus egress approve/reject."),
			reader("Pending egress requests"), mcpgo.WithOutputSchema[RequestsResult](),
		), handler: s.egressRequests},
		{tool: mcpgo.NewTool(ToolEgressApprove,
			mcpgo.WithDescription("Approve a pending egress request by id: a grant of its host (its port, ports, or 443 and 80), optionally for a while; "+
				"a lookup the guest still holds then proceeds. Off unless the operator started nexus with --mcp-egress; never a private address or a secret's host."),
			mcpgo.WithString("id", mcpgo.Required(), mcpgo.Description("request id from egress_requests (r-…)")),
			mcpgo.WithString("for", mcpgo.Description("end the grant on its own after this long, e.g. 30m")),
			mcpgo.WithArray("ports", mcpgo.Description("ports to allow (default the request's, or 443 and 80)"), mcpgo.Items(map[string]any{"type": "integer"})),
			hints{title: "Approve an egress request"}.opt(), mcpgo.WithOutputSchema[api.EgressChange](),
		), handler: s.egressApprove},
	}
}

func (s *Server) egressRequests(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	if err := bind(req, &struct{}{}); err != nil {
		return nil, err
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	list, err := c.EgressRequests(ctx)
	if err != nil {
		return nil, err
	}
	return RequestsResult{Requests: list}, nil
}

func (s *Server) egressApprove(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a approveArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.ID == "" {
		return nil, errdefs.Invalid("id is required")
	}
	d, err := grantFor(a.For)
	if err != nil {
		return nil, err
	}
	r := api.EgressAnswerRequest{ID: a.ID, Ports: a.Ports, For: d, By: "mcp client", Via: "mcp"}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	return c.EgressApprove(ctx, r)
}

func (s *Server) egressChange(ctx context.Context, req mcpgo.CallToolRequest, call func(*api.Client, api.EgressChangeRequest) (api.EgressChange, error)) (any, error) {
	var a egressArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Name == "" || a.Host == "" {
		return nil, errdefs.Invalid("name and host are required")
	}
	d, err := grantFor(a.For)
	if err != nil {
		return nil, err
	}
	r := api.EgressChangeRequest{Name: a.Name, Host: a.Host, For: d, By: "mcp client", Via: "mcp"}
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

// grantFor parses the for argument of a grant ("" is until revoked).
func grantFor(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, errdefs.Invalid("invalid for %q: use a duration like 30m or 2h", s)
	}
	return d, nil
}
