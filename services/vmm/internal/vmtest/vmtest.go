// Package vmtest holds helpers for tests that boot real QEMU guests.
//
// Downloads and slow builds are shared between test runs in CacheDir (/tmp/nexus-test-cache, or
// $NEXUS_TEST_CACHE): the guest kernel, and images built by image tests. Tests never use the
// real $NEXUS_HOME.
package vmtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/services/vmm/kernel"
)

// CacheDir is the cache shared by test runs.
func CacheDir() string {
	if d := os.Getenv("NEXUS_TEST_CACHE"); d != "" {
		return d
	}
	return "/tmp/nexus-test-cache"
}

// RequireQEMU skips the test when QEMU is missing, or fails it when CI is set.
func RequireQEMU(t testing.TB) {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is required in CI: %v", tool, err)
			}
			t.Skipf("%s not installed", tool)
		}
	}
}

// Kernel returns the guest kernel from the shared cache, fetching it on first use.
func Kernel(t testing.TB) *kernel.Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := kernel.Ensure(ctx, CacheDir(), nil)
	if err != nil {
		t.Fatalf("kernel: %v", err)
	}
	return k
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// BuildGo builds a static binary of the package at dir (relative to this file's directory tree
// root services/vmm, e.g. "internal/vmtest/testinit") once per test process.
func BuildGo(t testing.TB, rel string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[rel]; ok {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	vmmDir := filepath.Join(filepath.Dir(file), "..", "..")
	out := filepath.Join(CacheDir(), "bin")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	// go build writes a temp file and renames it, so concurrent test binaries sharing this
	// path never see a half-written file.
	bin := filepath.Join(out, filepath.Base(rel))
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./"+rel)
	cmd.Dir = vmmDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", rel, err, b)
	}
	built[rel] = bin
	return bin
}

// TestInit builds the test init (see testinit) and returns its path.
func TestInit(t testing.TB) string { return BuildGo(t, "internal/vmtest/testinit") }

// WaitFor polls cond until it returns nil or timeout passes, then fails with cond's last error.
func WaitFor(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
