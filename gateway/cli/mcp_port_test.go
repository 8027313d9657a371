package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMCPHonoursBusPort: with the stack down, `nexus mcp` dials NEXUS_BUS_PORT (not 4244) and
// its tool error names that port.
func TestMCPHonoursBusPort(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	h := t.TempDir()
	t.Setenv("NEXUS_HOME", h)
	// Credentials of a stack that is down: the dial, not the credentials, is what fails.
	os.MkdirAll(filepath.Join(h, "bus", "creds"), 0o700)
	os.WriteFile(filepath.Join(h, "bus", "creds", "cli.json"), []byte(`{"user":"cli","password":"x"}`), 0o600)
	t.Setenv("NEXUS_BUS_PORT", "4999")
	in, err := os.CreateTemp(t.TempDir(), "stdin")
	if err != nil {
		t.Fatal(err)
	}
	in.WriteString(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}` + "\n" +
		`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sandbox_list","arguments":{}}}` + "\n")
	in.Seek(0, 0)
	saved := os.Stdin
	os.Stdin = in
	defer func() { os.Stdin = saved }()
	code, out := runNexusStdout(t, "mcp")
	if code != 0 || !strings.Contains(out, `"id":2`) || !strings.Contains(out, "127.0.0.1:4999") || strings.Contains(out, ":4244") {
		t.Fatalf("nexus mcp with NEXUS_BUS_PORT=4999 and no stack: exit %d\n%s", code, out)
	}
}
