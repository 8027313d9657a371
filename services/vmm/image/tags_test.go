package image_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/image"
)

// TestBuiltinTags: a built-in image's record from before tags (name, built, sizes only) loads
// with its build-date tag and latest, and a tag it does not have is refused.
func TestBuiltinTags(t *testing.T) {
	h := tempHome(t)
	os.MkdirAll(h.Images(), 0o755)
	legacy := `{"name":"nexus-mini","built":"2026-08-07T10:00:00Z","size":1,"disk_usage":1,"content":1,"build_seconds":1}`
	os.WriteFile(filepath.Join(h.Images(), "nexus-mini.json"), []byte(legacy), 0o644)
	os.WriteFile(filepath.Join(h.Images(), "nexus-mini.ext4"), nil, 0o444)
	for _, ref := range []string{"nexus-mini", "nexus-mini:latest", "nexus-mini:20260807"} {
		info, err := image.Resolve(h, ref)
		if err != nil {
			t.Fatalf("Resolve(%s): %v", ref, err)
		}
		if info.Key != "nexus-mini" || !slices.Equal(info.Tags, []string{"20260807", "latest"}) || info.Source != "built" {
			t.Errorf("Resolve(%s) = key %s tags %v source %s", ref, info.Key, info.Tags, info.Source)
		}
	}
	_, err := image.Resolve(h, "nexus-mini:bogus")
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "its tags are 20260807, latest") {
		t.Errorf("nexus-mini:bogus: %v", err)
	}
	list, err := image.List(h)
	if err != nil || len(list) != 1 || list[0].Created.IsZero() {
		t.Fatalf("List = %+v, %v", list, err)
	}
	for _, bad := range []string{"Nexus", "a b", "x:", "x@sha256:12", "../x"} {
		if _, err := image.ParseRef(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseRef(%q) = %v, want invalid", bad, err)
		}
	}
	if r, err := image.ParseRef("docker.io/alpine:3"); err != nil || r.Name != "docker.io/library/alpine" || r.Tag != "3" {
		t.Errorf("ParseRef(docker.io/alpine:3) = %+v, %v", r, err)
	}
	if r, _ := image.ParseRef("localhost:5000/x/y:1.0"); r.Name != "localhost:5000/x/y" || r.Tag != "1.0" || !r.Remote() {
		t.Errorf("ParseRef(localhost:5000/x/y:1.0) = %+v", r)
	}
}
