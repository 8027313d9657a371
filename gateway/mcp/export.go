package mcp

import (
	"context"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// RunCommand is sandbox_exec for the other front ends (the HTTP API's POST exec): it checks
// argv, env and stdin as the tool does, runs req with timeout ("" is DefaultExecTimeout) and
// returns the tool's result.
func RunCommand(ctx context.Context, c *api.Client, req api.ExecRequest, stdin *string, timeout string) (*ExecResult, error) {
	if err := checkCommand(req.Argv, req.Env, stdin); err != nil {
		return nil, err
	}
	d, err := execTimeout(timeout)
	if err != nil {
		return nil, err
	}
	return runCommand(ctx, c, req, stdin, d)
}

// CheckCommand checks argv, env and stdin as sandbox_exec does (the HTTP API's streaming exec).
func CheckCommand(argv, env []string, stdin *string) error { return checkCommand(argv, env, stdin) }
