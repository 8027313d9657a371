package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRAMFileIsPrivate: the guest RAM file is made 0600 in a 0700 directory of its own (any
// local user could read guest memory from a 0644 file), and removeRAM takes both away.
func TestRAMFileIsPrivate(t *testing.T) {
	p := defaultRAMPath("sb-test", t.TempDir())
	if !strings.HasPrefix(p, "/dev/shm/nexus-sb-test-") || filepath.Dir(filepath.Dir(p)) != "/dev/shm" {
		t.Fatalf("RAM path %s", p)
	}
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	defer removeRAM(p)
	if err := createRAM(p); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{p: 0o600, filepath.Dir(p): 0o700} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	removeRAM(p)
	if _, err := os.Stat(filepath.Dir(p)); !os.IsNotExist(err) {
		t.Errorf("the RAM directory is still there: %v", err)
	}
}
