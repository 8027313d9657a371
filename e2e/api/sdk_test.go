package api_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// sdkRoot is the module's sdk directory.
func sdkRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "sdk")
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

// runSuite runs one SDK's own test suite against the live API on the shared sandbox box.
// env are more NAME=VALUE for it.
func runSuite(t *testing.T, dir, token string, env []string, argv ...string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "HOME="+dir, "NEXUS_API_URL="+base, "NEXUS_API_TOKEN="+token,
		"NEXUS_SDK_SANDBOX="+box, "NEXUS_SDK_CREATE=", "NEXUS_SDK_FORK=", "PYTHONDONTWRITEBYTECODE=1",
		"npm_config_cache="+filepath.Join(dir, ".npm"), "npm_config_update_notifier=false"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	t.Logf("%s:\n%s", strings.Join(argv, " "), tail(string(out), 2000))
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// testSDKs installs each SDK the way its README says, offline, into a temporary directory and
// runs its own suite (issue 28): exec with streamed output, 50 MB of it to a stalled reader,
// files, labels, ports and errors mapped to exception types, all on the package's one sandbox;
// Python's also creates and removes one of its own.
func testSDKs(t *testing.T, token string) {
	root := sdkRoot(t)
	t.Run("python", func(t *testing.T) {
		py := need(t, "/usr/bin/python3")
		dir := t.TempDir()
		// pip builds in its source tree: build a copy, never the checkout.
		src := filepath.Join(dir, "src")
		if out, err := exec.Command("cp", "-r", filepath.Join(root, "python"), src).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		lib := filepath.Join(dir, "lib")
		runSuite(t, dir, token, nil, py, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index", "--no-deps", "--target", lib, src)
		// Python's suite also runs the create → exec → files → remove flow (one more boot).
		runSuite(t, dir, token, []string{"PYTHONPATH=" + lib, "NEXUS_SDK_CREATE=1"}, py, "-m", "unittest", "discover", "-v", "-s", filepath.Join(src, "tests"))
	})
	t.Run("typescript", func(t *testing.T) {
		node := need(t, "node")
		npm := need(t, "npm")
		dir := t.TempDir()
		src := filepath.Join(dir, "src")
		if out, err := exec.Command("cp", "-r", filepath.Join(root, "typescript"), src).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		runSuite(t, src, token, nil, npm, "pack", "--silent", "--pack-destination", dir)
		runSuite(t, dir, token, nil, npm, "install", "--offline", "--no-audit", "--no-fund", "--silent", "./nexus-sandbox-0.1.0.tgz")
		test := filepath.Join(dir, "sdk.test.mjs")
		b, err := os.ReadFile(filepath.Join(src, "test", "sdk.test.mjs"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(test, b, 0o644); err != nil {
			t.Fatal(err)
		}
		runSuite(t, dir, token, nil, node, "--test", test)
	})
}
