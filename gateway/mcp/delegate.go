package mcp

import (
	"context"
	"errors"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// Worktree delegation (issue 9, seed "worktree-native parallel flow") lives in the gateway
// (gateway/delegate.go, the delegate.* verbs); these tools are its clients.

func (s *Server) delegateWorktreeCreate(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a api.DelegateCreateRequest
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	a.Progress = ""
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, api.DelegateTimeout)
	defer cancel()
	return c.DelegateCreate(ctx, a)
}

func (s *Server) delegateAgentDispatch(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var d struct {
		Name    string   `json:"name"`
		Brief   string   `json:"brief"`
		Command []string `json:"command"`
	}
	if err := bind(req, &d); err != nil {
		return nil, err
	}
	a := api.DispatchRequest{Sandbox: d.Name, Brief: d.Brief, Command: d.Command}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, api.DispatchTimeout)
	defer cancel()
	return c.DelegateDispatch(ctx, a)
}

func (s *Server) delegateAgentPoll(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var p struct {
		Name    string `json:"name"`
		Commits int    `json:"commits"`
	}
	if err := bind(req, &p); err != nil {
		return nil, err
	}
	a := api.PollRequest{Sandbox: p.Name, Commits: p.Commits}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	return c.DelegatePoll(ctx, a)
}

func (s *Server) delegateTeardown(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var t nameArgs
	if err := bind(req, &t); err != nil {
		return nil, err
	}
	a := api.TeardownRequest{Sandbox: t.Name, Force: t.Force != nil && *t.Force}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, api.DelegateTimeout)
	defer cancel()
	res, err := c.DelegateTeardown(ctx, a)
	var dirty *api.DirtyError
	if errors.As(err, &dirty) {
		return nil, &toolError{msg: dirty.Message, details: map[string]any{
			"sandbox": dirty.Sandbox, "worktree": dirty.Worktree, "branch": dirty.Branch, "changed_files": dirty.ChangedFiles}}
	}
	return res, err
}
