// Package vmtest holds the vmm's helpers for tests that boot real QEMU guests: the guest kernel
// and static test binaries, kept in the one test cache (testutil.CacheDir) between runs. The
// generic helpers (RequireQEMU, WaitFor, CacheDir) are internal/testutil's.
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

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/services/vmm/kernel"
)

// Kernel returns the guest kernel from the shared cache, fetching it on first use.
func Kernel(t testing.TB) *kernel.Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := kernel.Ensure(ctx, testutil.CacheDir(), nil)
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
	out := filepath.Join(testutil.CacheDir(), "test", "bin")
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
