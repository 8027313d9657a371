package mcp

import (
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// TestReadmeListsEveryTool: the README's MCP tool table names exactly the server's tools.
func TestReadmeListsEveryTool(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### MCP tools\n")
	if !ok {
		t.Fatal("README.md has no \"### MCP tools\" section")
	}
	if i := strings.Index(section, "\n#"); i >= 0 {
		section = section[:i]
	}
	var readme []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(section, -1) {
		readme = append(readme, m[1])
	}
	srv, err := New(Config{Log: zerolog.Nop(), Dial: func(context.Context) (*nats.Conn, error) { return nil, errors.New("no bus") }})
	if err != nil {
		t.Fatal(err)
	}
	var tools []string
	for _, tl := range srv.MCPServer().ListTools() {
		tools = append(tools, tl.Tool.Name)
	}
	slices.Sort(readme)
	slices.Sort(tools)
	if !slices.Equal(readme, tools) {
		t.Errorf("README lists %v\nthe server has %v", readme, tools)
	}
}
