package vmm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
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

func TestSnapshotListSkipsUnfinished(t *testing.T) {
	h := t.TempDir()
	s := &Service{cfg: Config{Home: home.Dir(h)}}
	snaps := filepath.Join(h, "snapshots")
	for _, d := range []string{"done", ".tmp-half-123", ".rm-gone-456"} {
		os.MkdirAll(filepath.Join(snaps, d), 0o700)
		os.WriteFile(filepath.Join(snaps, d, "snapshot.json"), []byte(`{"name":"`+d+`","image":"nexus-mini"}`), 0o600)
	}
	list, err := s.snapshotList(context.Background(), api.Empty{})
	if err != nil || len(list) != 1 || list[0].Name != "done" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if users := s.snapshotsOfImage("nexus-mini"); len(users) != 1 || users[0] != "snapshot done" {
		t.Fatalf("snapshotsOfImage: %v", users)
	}
	s.cleanSnapshotTemps()
	left, _ := filepath.Glob(filepath.Join(snaps, "*"))
	hidden, _ := filepath.Glob(filepath.Join(snaps, ".*"))
	if len(left) != 1 || len(hidden) != 0 {
		t.Fatalf("after cleanup: %v %v", left, hidden)
	}
	if _, _, err := s.loadSnapshot("done"); !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("loading a snapshot without its files: %v, want refused", err)
	}
	if _, _, err := s.loadSnapshot("none"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("loading a missing snapshot: %v, want not found", err)
	}
	if _, _, err := s.loadSnapshot("../x"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("loading ../x: %v, want invalid", err)
	}
}
