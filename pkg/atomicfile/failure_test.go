package atomicfile

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A write that fails half way (here the file size limit, as a full disk fails it) returns the
// error and leaves neither the temp file nor a changed target behind.
func TestFailedWriteLeavesNothing(t *testing.T) {
	if dir := os.Getenv("ATOMICFILE_CHILD_DIR"); dir != "" {
		// The child: every write past 1 KiB fails with EFBIG (Go ignores SIGXFSZ).
		lim := syscall.Rlimit{Cur: 1024, Max: 1024}
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
			t.Fatal(err)
		}
		err := WriteFile(filepath.Join(dir, "rec.json"), []byte(strings.Repeat("x", 64<<10)), 0o600)
		if err == nil || !strings.Contains(err.Error(), "rec.json") {
			t.Fatalf("the write did not fail with a sentence naming the file: %v", err)
		}
		return
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rec.json"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFailedWriteLeavesNothing$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ATOMICFILE_CHILD_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("left in the directory: %v", names)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "rec.json")); string(b) != "old" {
		t.Fatalf("the target became %q", b)
	}
}
