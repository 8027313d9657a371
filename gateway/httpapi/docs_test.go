package httpapi

import (
	"os"
	"strings"
	"testing"
)

// docs/api.md documents each route's and each MCP tool's scope as the code has it.
func TestDocsListEveryScope(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, rt := range Routes {
		if row := "| `" + rt.Method + " " + rt.Path + "` | " + string(rt.Scope) + " |"; !strings.Contains(doc, row) {
			t.Errorf("docs/api.md lacks the row %s", row)
		}
	}
	for tool, scope := range ToolScopes {
		if row := "| `" + tool + "` | " + string(scope) + " |"; !strings.Contains(doc, row) {
			t.Errorf("docs/api.md lacks the row %s", row)
		}
	}
}
