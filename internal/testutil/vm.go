package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// cacheDefault is fixed before any test moves HOME or NEXUS_HOME: the cache of the nexus home
// the tests were started from, as the Makefile's NEXUS_CACHE ?= $(NEXUS_HOME)/cache.
var cacheDefault = func() string {
	if h := os.Getenv("NEXUS_HOME"); h != "" {
		return filepath.Join(h, "cache")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "nexus", "cache")
	}
	return filepath.Join(os.TempDir(), "nexus-test-cache")
}()

// CacheDir is the one download cache every test and every stack it starts shares (kernel, debs,
// images' inputs, initramfs): $NEXUS_CACHE, else $NEXUS_HOME/cache of the invoking user. What
// only tests build (test binaries, an image test's home) lives in its "test" subdirectory.
func CacheDir() string {
	if v := os.Getenv("NEXUS_CACHE"); v != "" {
		return v
	}
	return cacheDefault
}

// RequireQEMU skips a test that needs QEMU when it is missing, and fails it when CI is set: a
// VM test that cannot run in CI is a failure, not a pass.
func RequireQEMU(t testing.TB) {
	t.Helper()
	if err := QEMUAvailable(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs QEMU: %v", err)
		}
		t.Skipf("QEMU not available: %v", err)
	}
}

// QEMUAvailable reports whether the QEMU binaries the vmm needs are installed.
func QEMUAvailable() error {
	for _, b := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%s not found (apt-get install qemu-system-x86 qemu-utils)", b)
		}
	}
	return nil
}
