package fsutil

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// allocated is the bytes of disk a file really uses (st_blocks is in 512-byte units).
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 8 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	chunks := map[int64][]byte{0: bytes.Repeat([]byte("a"), 4096), 3 << 20: bytes.Repeat([]byte("b"), 10000), size - 4096: bytes.Repeat([]byte("c"), 4096)}
	for off, b := range chunks {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if allocated(t, src) >= size/2 {
		t.Skipf("the test directory's filesystem does not keep holes (%d bytes allocated)", allocated(t, src))
	}
	dst := filepath.Join(dir, "dst")
	n, err := CopySparse(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, want) {
		t.Fatal("copy differs from the source")
	}
	fi, _ := os.Stat(dst)
	if fi.Size() != size || fi.Mode().Perm() != 0o600 {
		t.Fatalf("copy is %d bytes mode %v, want %d bytes mode 0600", fi.Size(), fi.Mode().Perm(), size)
	}
	if n >= size/2 {
		t.Errorf("copied %d bytes of data for %d bytes written: holes were copied", n, 4096*2+10000)
	}
	if a := allocated(t, dst); a >= size/2 {
		t.Errorf("the copy uses %d bytes of disk for %d bytes written: its holes were filled", a, 4096*2+10000)
	}
}

func TestCopySparseRefuses(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	os.WriteFile(src, []byte("new"), 0o600)
	os.WriteFile(dst, []byte("old"), 0o600)
	if _, err := CopySparse(src, dst); err == nil {
		t.Error("CopySparse overwrote an existing file")
	}
	if b, _ := os.ReadFile(dst); string(b) != "old" {
		t.Errorf("the existing file now holds %q", b)
	}
	if _, err := CopySparse(filepath.Join(dir, "missing"), filepath.Join(dir, "x")); err == nil {
		t.Error("CopySparse of a missing file succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Errorf("a failed copy left its destination behind: %v", err)
	}
}
