package httpapi

import (
	"context"
	"net/http"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/IniZio/nexus/gateway/mcp"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// ToolScopes is the scope each MCP tool needs at /mcp. sandbox_create needs admin when its
// arguments reach the host (secrets, a host config file, an agent that live-mounts host
// credentials), as POST /v1/sandboxes does; sandbox_run boots the default agent, so admin.
var ToolScopes = map[string]Scope{
	mcp.ToolSandboxList:      ScopeRead,
	mcp.ToolSandboxGet:       ScopeRead,
	mcp.ToolSandboxLogs:      ScopeRead,
	mcp.ToolSandboxPorts:     ScopeRead,
	mcp.ToolEgressAudit:      ScopeRead,
	mcp.ToolSandboxCreate:    ScopeWrite,
	mcp.ToolSandboxStart:     ScopeWrite,
	mcp.ToolSandboxStop:      ScopeWrite,
	mcp.ToolSandboxPause:     ScopeWrite,
	mcp.ToolSandboxResume:    ScopeWrite,
	mcp.ToolSandboxRemove:    ScopeWrite,
	mcp.ToolSandboxExec:      ScopeWrite,
	mcp.ToolSandboxSnapshot:  ScopeWrite,
	mcp.ToolSandboxFork:      ScopeWrite,
	mcp.ToolSandboxRun:       ScopeAdmin,
	mcp.ToolWorktreeCreate:   ScopeAdmin,
	mcp.ToolAgentDispatch:    ScopeAdmin,
	mcp.ToolAgentPoll:        ScopeAdmin,
	mcp.ToolDelegateTeardown: ScopeAdmin,
	// Egress changes open the perimeter: admin only (and off unless --mcp-egress).
	mcp.ToolEgressAllow:    ScopeAdmin,
	mcp.ToolEgressRevoke:   ScopeAdmin,
	mcp.ToolEgressRequests: ScopeRead,
	mcp.ToolEgressApprove:  ScopeAdmin,
}

// authorizeTool checks the caller's token against the tool's scope. A tool missing from
// ToolScopes needs admin: a new tool is never open by accident.
func authorizeTool(ctx context.Context, tool string, req mcpgo.CallToolRequest) error {
	tok, ok := callerOf(ctx)
	if !ok {
		return nil // stdio: the local user
	}
	scope, known := ToolScopes[tool]
	if !known {
		scope = ScopeAdmin
	}
	why := "tool " + tool
	if tool == mcp.ToolSandboxCreate && scope != ScopeAdmin {
		var a struct {
			Secrets []string `json:"secrets"`
			Config  string   `json:"config"`
			Agent   string   `json:"agent"`
		}
		req.BindArguments(&a)
		cr := api.CreateRequest{Secrets: a.Secrets, Agent: a.Agent}
		if r := createAdminReason(&cr); r != "" {
			scope, why = ScopeAdmin, why+" with "+r
		} else if a.Config != "" {
			scope, why = ScopeAdmin, why+" with a config file of the host"
		}
	}
	if !tok.Scope.Allows(scope) {
		return errdefs.Refused("token %s has scope %s: %s needs scope %s", tok.Name, tok.Scope, why, scope)
	}
	return nil
}

// mcpHandler serves the MCP tools over streamable HTTP; the guard has already checked the
// token, which the tool calls find in their context.
func (s *Service) mcpHandler() http.Handler {
	return server.NewStreamableHTTPServer(s.mcp.MCPServer(),
		server.WithEndpointPath("/mcp"),
		server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			if c, ok := r.Context().Value(callerKey{}).(caller); ok {
				return context.WithValue(ctx, callerKey{}, c)
			}
			return ctx
		}),
	)
}
