package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/IniZio/nexus"

// TestImportBoundaries enforces the process boundaries of DESIGN §1: services talk over the bus,
// never through each other's code; the gateway reaches them only through pkg/api; pkg is shared
// by all and imports none of them; the guest agent shares only pkg.
func TestImportBoundaries(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps=false", "-json=ImportPath,Imports,TestImports,XTestImports", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	checked := 0
	for dec.More() {
		var p struct {
			ImportPath                         string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			if reason := forbidden(rel, strings.TrimPrefix(imp, module+"/")); reason != "" {
				t.Errorf("%s imports %s: %s", rel, imp, reason)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no imports were checked")
	}
}

// forbidden says why from may not import to, or "" when it may.
func forbidden(from, to string) string {
	service := func(p string) string {
		if !strings.HasPrefix(p, "services/") {
			return ""
		}
		return strings.SplitN(strings.TrimPrefix(p, "services/"), "/", 2)[0]
	}
	switch {
	case from == "" || strings.HasPrefix(from, "e2e/"):
		return "" // the composition root and the end-to-end tests may wire anything
	case strings.HasPrefix(from, "pkg/") && (strings.HasPrefix(to, "services/") || strings.HasPrefix(to, "gateway")):
		return "pkg is shared by every process and must not depend on a service or the gateway"
	case strings.HasPrefix(from, "gateway") && strings.HasPrefix(to, "services/"):
		return "the gateway reaches services only over the bus through pkg/api/<service>"
	case strings.HasPrefix(from, "services/") && strings.HasPrefix(to, "gateway"):
		return "services never depend on the gateway"
	case strings.HasPrefix(from, "services/vmm/agent") && !strings.HasPrefix(to, "pkg/") && !strings.HasPrefix(to, "services/vmm/agent"):
		return "the guest agent shares only pkg with the host"
	case service(from) != "" && service(to) != "" && service(from) != service(to):
		return "services never import each other; they talk over the bus"
	}
	return ""
}

func TestForbiddenRules(t *testing.T) {
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{"services/mitm", "services/netstack", false},
		{"services/vmm", "services/vmm/guest", true},
		{"gateway", "services/vmm", false},
		{"gateway/cli", "pkg/api/vmm", true},
		{"pkg/bus", "gateway", false},
		{"services/vmm/agent", "services/vmm/guest", false},
		{"services/vmm/agent", "pkg/agentproto", true},
		{"services/portfwd", "gateway/cli", false},
	} {
		if got := forbidden(c.from, c.to) == ""; got != c.ok {
			t.Errorf("forbidden(%s, %s) allowed=%v, want %v", c.from, c.to, got, c.ok)
		}
	}
}
