package vmm

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 8 << 20
	f.Truncate(size)
	chunks := map[int64][]byte{0: bytes.Repeat([]byte("a"), 4096), 3 << 20: bytes.Repeat([]byte("b"), 10000), size - 4096: bytes.Repeat([]byte("c"), 4096)}
	for off, b := range chunks {
		f.WriteAt(b, off)
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	n, err := copySparse(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, want) {
		t.Fatal("copy differs from the source")
	}
	if n >= size/2 {
		t.Errorf("copied %d bytes of data for %d bytes written: holes were copied", n, 4096*2+10000)
	}
	if _, err := copySparse(src, dst); err == nil {
		t.Error("copySparse overwrote an existing file")
	}
	if _, err := copySparse(filepath.Join(dir, "missing"), filepath.Join(dir, "x")); err == nil {
		t.Error("copySparse of a missing file succeeded")
	}
}

func TestCapped(t *testing.T) {
	c := &capped{max: 5}
	c.Write([]byte("abc"))
	c.Write([]byte("defgh"))
	if n, _ := c.Write([]byte("ij")); n != 2 || c.String() != "abcde" {
		t.Fatalf("capped: %q", c.String())
	}
}
