package vmm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

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
