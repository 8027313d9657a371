package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileReplacesWholeWithMode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("old content that is longer"), 0o644)
	if err := WriteFile(p, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "new" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("got %q mode %v", b, fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".f.tmp-*")); len(left) != 0 {
		t.Fatalf("temp files left: %v", left)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "f"), nil, 0o600); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

func TestReplaceReplacesWholeWithMode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("old content that is longer"), 0o644)
	if err := Replace(p, []byte("new"), 0o444); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "new" || fi.Mode().Perm() != 0o444 {
		t.Fatalf("got %q mode %v", b, fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".f.tmp-*")); len(left) != 0 {
		t.Fatalf("temp files left: %v", left)
	}
}
