package mcp_test

import (
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// TestCreateSecretCeiling: an agent's sandbox_create binds a secret only within the hosts it was
// stored for (`nexus secret set NAME --host`), and cannot bind a secret stored without hosts at
// all (only the user's own `nexus create --secret` can). Both are tool errors naming the secret
// and the host, refused before anything is created.
func TestCreateSecretCeiling(t *testing.T) {
	for _, s := range [][]string{{"MCP_HOSTED", "--host", "api.example.com"}, {"MCP_OPEN"}} {
		if _, errOut, code := stack.NexusIn(t, []byte("value-of-"+s[0]+"\n"), append([]string{"secret", "set"}, s...)...); code != 0 {
			t.Fatalf("secret set %v: %s", s, errOut)
		}
	}
	c := mcpClient(t)
	for _, tc := range []struct{ secret, want string }{
		{"MCP_HOSTED@evil.example", "secret MCP_HOSTED may not be sent to evil.example: it is stored for api.example.com only"},
		{"MCP_HOSTED@api.example.com,evil.example", "secret MCP_HOSTED may not be sent to evil.example"},
		{"MCP_OPEN@api.example.com", "secret MCP_OPEN may not be sent to api.example.com: it is stored without hosts, so only `nexus create --secret MCP_OPEN@api.example.com` can bind it"},
	} {
		res := call(t, c, "sandbox_create", map[string]any{"name": "ceiling", "image": "nexus-mini", "secrets": []string{tc.secret}}, nil)
		var msg string
		for _, ct := range res.Content {
			if tx, ok := ct.(mcpgo.TextContent); ok {
				msg += tx.Text
			}
		}
		if !res.IsError || !strings.Contains(msg, tc.want) || strings.Contains(msg, "value-of-") {
			t.Fatalf("sandbox_create secrets %s: error %v: %s", tc.secret, res.IsError, msg)
		}
	}
	if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "ceiling") {
		t.Fatalf("a refused sandbox_create left a sandbox:\n%s", out)
	}
}
