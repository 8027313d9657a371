package api_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

// The TypeScript compiler the TypeScript suite is checked with, fetched with npm once into the
// test cache (later runs are offline), and the Node.js types it checks against.
const (
	typescriptVersion = "5.9.3"
	typesNodeVersion  = "20.19.9"
)

// repoRoot is the module's root directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// need finds a tool the SDK suites run with: in CI its absence fails (the Makefile's apt list
// installs it), elsewhere it skips.
func need(t *testing.T, path string) string {
	t.Helper()
	p, err := exec.LookPath(path)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is required in CI (make deps installs it): %v", path, err)
		}
		t.Skipf("%s not installed", path)
	}
	return p
}

// run runs one step of an SDK's suite against the live API (whose URL and token it gets only
// from the environment, as a user's program would) and returns its output. env are more
// NAME=VALUE for it.
func run(t *testing.T, dir string, env []string, argv ...string) string {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "HOME="+dir, "NEXUS_API_URL="+base, "NEXUS_API_TOKEN="+tokens["write"],
		"NEXUS_SDK_SANDBOX="+box, "NEXUS_SDK_READ_TOKEN="+tokens["read"], "NEXUS_SDK_ERROR_CODES="+strings.Join(errorCodes(t), ","),
		"PYTHONDONTWRITEBYTECODE=1", "npm_config_cache="+filepath.Join(testutil.CacheDir(), "npm"),
		"npm_config_update_notifier=false"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	t.Logf("%s:\n%s", strings.Join(argv, " "), tail(string(out), 2000))
	return string(out)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// errorCodes are the envelope's error codes, read from pkg/errdefs' Code constants, so a code
// added there fails the SDK suites until each SDK has an error class for it.
func errorCodes(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(repoRoot(), "pkg", "errdefs", "errdefs.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for name, obj := range f.Scope.Objects {
		if obj.Kind != ast.Con || !strings.HasPrefix(name, "Code") {
			continue
		}
		if v, ok := obj.Decl.(*ast.ValueSpec); ok && len(v.Values) == 1 {
			if lit, ok := v.Values[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, _ := strconv.Unquote(lit.Value)
				codes = append(codes, s)
			}
		}
	}
	if len(codes) < 6 {
		t.Fatalf("found only the error codes %v in pkg/errdefs", codes)
	}
	sort.Strings(codes)
	return codes
}

// readmeScript is the README's SDK example in lang (its first ```lang block under "### SDKs"):
// the test runs the text users read.
func readmeScript(t *testing.T, lang string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sect, ok := strings.Cut(string(b), "\n### SDKs\n")
	if !ok {
		t.Fatal("README.md has no ### SDKs section")
	}
	_, code, ok := strings.Cut(sect, "\n```"+lang+"\n")
	if !ok {
		t.Fatalf("README.md's SDKs section has no ```%s block", lang)
	}
	code, _, _ = strings.Cut(code, "\n```")
	return code + "\n"
}

// checkReadmeRun checks what the README's script printed: the command's lines as they came,
// then its exit code and the file it wrote; and that its sandbox is gone.
func checkReadmeRun(t *testing.T, out, want string) {
	t.Helper()
	if !strings.HasSuffix(out, "1\n2\n3\n"+want+"\n") {
		t.Errorf("the README's script printed %q, want the streamed 1 2 3 and then %q", out, want)
	}
	if r := call(t, tokens["read"], http.MethodGet, "/v1/sandboxes/demo", nil); r.status != http.StatusNotFound {
		t.Errorf("the README's sandbox demo is still there after its script: %d %s", r.status, r.body)
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if out, err := exec.Command("cp", "-r", from, to).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
}

// typescript is the cached compiler (fetched on first use) and the type roots it checks with.
func typescript(t *testing.T, npm string) (tsc, typeRoots string) {
	t.Helper()
	root := filepath.Join(testutil.CacheDir(), "sdk", "typescript-"+typescriptVersion+"-node-"+typesNodeVersion)
	tsc = filepath.Join(root, "node_modules", "typescript", "bin", "tsc")
	typeRoots = filepath.Join(root, "node_modules", "@types")
	if _, err := os.Stat(tsc); err == nil {
		return tsc, typeRoots
	}
	if err := os.MkdirAll(filepath.Dir(root), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(root), ".fetch-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	run(t, tmp, nil, npm, "install", "--prefix", tmp, "--no-save", "--no-package-lock", "--no-audit", "--no-fund", "--silent",
		"typescript@"+typescriptVersion, "@types/node@"+typesNodeVersion)
	// Whole or not at all: a parallel run may have put it there first.
	if err := os.Rename(tmp, root); err != nil {
		if _, serr := os.Stat(tsc); serr != nil {
			t.Fatal(err)
		}
	}
	return tsc, typeRoots
}

// testSDKs installs each SDK the way its README says, offline, into a temporary directory and
// runs its own suite (issue 28): exec with streamed output, 50 MB of it to a stalled reader,
// files, labels, ports, a snapshot and a fork of the package's sandbox, and every error code
// mapped to an exception type; then the README's example of that language.
//
// The two run in parallel, but only their preparation overlaps (pip, npm, tsc): the TypeScript
// suite waits for Python's, as both snapshot the same sandbox and the README's scripts both
// create "demo".
func testSDKs(t *testing.T, _ string) { // the token: run passes each suite tokens["write"] and tokens["read"]
	root := filepath.Join(repoRoot(), "sdk")
	pythonDone := make(chan struct{})
	t.Run("python", func(t *testing.T) {
		t.Parallel()
		defer close(pythonDone)
		py := need(t, "/usr/bin/python3")
		dir := t.TempDir()
		// pip builds in its source tree: build a copy, never the checkout.
		src := filepath.Join(dir, "src")
		copyDir(t, filepath.Join(root, "python"), src)
		lib := filepath.Join(dir, "lib")
		run(t, dir, nil, py, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index", "--no-deps", "--target", lib, src)
		env := []string{"PYTHONPATH=" + lib}
		run(t, dir, env, py, "-m", "unittest", "discover", "-v", "-s", filepath.Join(src, "tests"))
		script := filepath.Join(dir, "readme.py")
		if err := os.WriteFile(script, []byte(readmeScript(t, "python")), 0o644); err != nil {
			t.Fatal(err)
		}
		checkReadmeRun(t, run(t, dir, env, py, script), "0 b'hello'")
	})
	t.Run("typescript", func(t *testing.T) {
		t.Parallel()
		node := need(t, "node")
		npm := need(t, "npm")
		tsc, typeRoots := typescript(t, npm)
		dir := t.TempDir()
		src := filepath.Join(dir, "src")
		copyDir(t, filepath.Join(root, "typescript"), src)
		run(t, src, nil, npm, "pack", "--silent", "--pack-destination", dir)
		run(t, dir, nil, npm, "install", "--offline", "--no-audit", "--no-fund", "--silent", "./nexus-sandbox-0.1.0.tgz")
		// The suite and the README's script are TypeScript: tsc --strict checks them against
		// the installed package's index.d.ts, and node runs what it compiled against index.js.
		test := filepath.Join(dir, "test")
		if err := os.Mkdir(test, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"sdk.test.mts", "tsconfig.json"} {
			copyDir(t, filepath.Join(src, "test", f), filepath.Join(test, f))
		}
		if err := os.WriteFile(filepath.Join(test, "readme.mts"), []byte(readmeScript(t, "ts")), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, dir, nil, node, tsc, "-p", test, "--typeRoots", typeRoots)
		<-pythonDone
		run(t, dir, nil, node, "--test", filepath.Join(test, "out", "sdk.test.mjs"))
		checkReadmeRun(t, run(t, dir, nil, node, filepath.Join(test, "out", "readme.mjs")), "0 hello")
	})
}
