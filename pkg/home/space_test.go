package home

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
)

func TestParseWatermark(t *testing.T) {
	for in, want := range map[string]Watermark{
		"1GiB": {Bytes: 1 << 30}, "512MiB": {Bytes: 512 << 20}, "2G": {Bytes: 2 << 30}, "4096": {Bytes: 4096},
		"5%": {Percent: 5}, "0": {},
	} {
		if got, err := ParseWatermark(in); err != nil || got != want {
			t.Errorf("ParseWatermark(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "lots", "-1G", "100%", "1.5G", "99999999999999999999T"} {
		if _, err := ParseWatermark(bad); err == nil {
			t.Errorf("ParseWatermark(%q) accepted", bad)
		}
	}
	if w := (Watermark{Percent: 10}); w.Min(1000) != 100 || !w.Low(Space{Free: 99, Total: 1000}) || w.Low(Space{Free: 100, Total: 1000}) {
		t.Errorf("10%% of 1000: min %d", w.Min(1000))
	}
}

// TestCheckSpace fills a small tmpfs home past the watermark: the refusal is an unavailable
// error saying host disk full with the free space; freeing the space admits again.
func TestCheckSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	d := Dir(t.TempDir())
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", string(d)).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", string(d)).Run() })
	w := Watermark{Bytes: 4 << 20}
	if err := d.CheckSpace(w); err != nil {
		t.Fatalf("empty home refused: %v", err)
	}
	fill := filepath.Join(string(d), "fill")
	if err := os.WriteFile(fill, make([]byte, 13<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	err := d.CheckSpace(w)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.HasPrefix(err.Error(), "host disk full: ") || !strings.Contains(err.Error(), "below the low watermark of 4 MiB") {
		t.Fatalf("full home: %v", err)
	}
	if d.CheckSpace(Watermark{}) != nil {
		t.Fatal("a zero watermark refused")
	}
	os.Remove(fill)
	if err := d.CheckSpace(w); err != nil {
		t.Fatalf("freed home refused: %v", err)
	}
}
