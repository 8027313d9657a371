package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// envAllowed lists every place under services/, gateway/ and pkg/ that may read the process
// environment, with the reason. Settings are not among them: they come from pkg/settings, read
// once by the composition root and the CLI's globals. Key: "file func call".
var envAllowed = map[string]string{
	"gateway/cli/exec.go envOr os.Getenv":                       "`nexus shell` passes the user's own $TERM to the guest: per-command user data",
	"gateway/cli/egress.go secretCommand os.LookupEnv":          "`secret set --from-env NAME` reads the variable the user named: per-command user data",
	"gateway/cli/imagebuild.go runDockerBuild os.LookupEnv":     "`image build --build-arg NAME` takes the variable the user named, as docker does: per-command user data",
	"gateway/internal/worktree/git.go runGit os.Environ":        "host git runs in the user's environment (their git config, credentials, PATH)",
	"services/gitrelay/sshconf.go defaults os.LookupEnv":        "the host ssh runs with the user's PATH, HOME, USER, LOGNAME and SSH_AUTH_SOCK: its environment, not a nexus setting",
	"services/vmm/image/build.go debootstrap os.Environ":        "debootstrap runs in the host's environment (proxy variables, PATH)",
	"services/vmm/image/agent.go hostCABundle os.Getenv":        "SSL_CERT_FILE names the host's CA bundle, the same variable Go's crypto/x509 reads for the host's own roots",
	"services/vmm/internal/vmtest/vmtest.go BuildGo os.Environ": "test scaffolding: go build of test guests inherits the toolchain's environment",
}

// TestNoEnvOutsideSettings fails on a read of the environment (os.Getenv, os.LookupEnv,
// os.Environ) under services/, gateway/ or pkg/ that is not in envAllowed. The guest agent is
// exempt (it is PID 1 of the guest, configured by its own environment) and pkg/settings is the
// table itself.
func TestNoEnvOutsideSettings(t *testing.T) {
	seen := map[string]bool{}
	for _, root := range []string{"services", "gateway", "pkg"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path == "services/vmm/agent" || path == "pkg/settings" || d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			for _, use := range envReads(t, path) {
				seen[use] = true
				if _, ok := envAllowed[use]; !ok {
					t.Errorf("%s reads the environment: take the value from a service Config (a setting belongs in pkg/settings' table), or add it to envAllowed with the reason", use)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for use := range envAllowed {
		if !seen[use] {
			t.Errorf("envAllowed lists %q, which no longer reads the environment: remove it", use)
		}
	}
}

// envReads returns "file func call" for every os.Getenv, os.LookupEnv and os.Environ in path.
func envReads(t *testing.T, path string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	osName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"os"` {
			osName = "os"
			if imp.Name != nil {
				osName = imp.Name.Name
			}
		}
	}
	if osName == "" {
		return nil
	}
	var out []string
	for _, decl := range f.Decls {
		name := "(top level)"
		if fd, ok := decl.(*ast.FuncDecl); ok {
			name = fd.Name.Name
		}
		ast.Inspect(decl, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == osName {
				switch sel.Sel.Name {
				case "Getenv", "LookupEnv", "Environ", "ExpandEnv":
					out = append(out, filepath.ToSlash(path)+" "+name+" os."+sel.Sel.Name)
				}
			}
			return true
		})
	}
	sort.Strings(out)
	return out
}
