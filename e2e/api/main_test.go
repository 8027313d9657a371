// Package api_test drives a real stack through its HTTP API (`nexus up --api`): a Go HTTP and
// WebSocket client and an MCP streamable-HTTP client, on one nexus-mini sandbox: create, exec
// (POST and WebSocket with stdin and a PTY), files, logs, audit, remove; bad tokens, a scope
// too weak, a foreign Origin and a rebound Host refused (issue 27).
package api_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

var (
	stack *testutil.Stack
	// base is the API's URL; tokens are the secrets of a token of each scope.
	base   string
	tokens = map[string]string{}
)

func TestMain(m *testing.M) {
	testutil.Main(m, &stack, testutil.Warm(),
		testutil.Setup(func(f *testutil.Fixture) error {
			port, err := testutil.BusPort()
			if err != nil {
				return err
			}
			base = "http://127.0.0.1:" + strconv.Itoa(port)
			f.Flags("--api=127.0.0.1:" + strconv.Itoa(port))
			return nil
		}),
		testutil.Started(func(s *testutil.Stack) error {
			for _, scope := range []string{"read", "write", "admin"} {
				out, err := s.Command("token", "create", "e2e-"+scope, "--scope", scope).Output()
				if err != nil {
					return fmt.Errorf("token create %s: %w", scope, err)
				}
				tokens[scope] = strings.TrimSpace(string(out))
			}
			return nil
		}))
}
