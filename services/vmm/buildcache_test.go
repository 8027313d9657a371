package vmm

// The build cache's layers (services/vmm/image/layers.go) are files and qemu-img, no VM: tested
// here, beside the vmm that keeps them, where a run needs no VM test slot.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/image"
)

func layerHome(t *testing.T) home.Dir {
	t.Helper()
	for _, tool := range []string{"qemu-img", "qemu-io"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	return home.Dir(t.TempDir())
}

// write puts 64 KiB of byte b at offset off of a qcow2 disk, as a build step's writes.
func write(t *testing.T, disk string, off string, b byte) {
	t.Helper()
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", fmt.Sprintf("write -P 0x%02x %s 64k", b, off), disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
}

func stepKey(n byte) string { return strings.Repeat(fmt.Sprintf("%02x", n), 32) }

// TestBuildCacheLayers: each step's disk becomes a layer over the one before; a later build
// starts a disk on a layer and reads every earlier step's writes; an image flattened from the
// chain keeps its content after every layer is pruned; layers a sandbox or another layer needs
// are kept; a layer whose base image is gone is dropped; an interrupted save leaves no layer.
func TestBuildCacheLayers(t *testing.T) {
	h := layerHome(t)
	ctx := context.Background()
	raw := filepath.Join(t.TempDir(), "base.ext4")
	if err := os.WriteFile(raw, bytes.Repeat([]byte{'A'}, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	base, err := image.Commit(ctx, h, raw, nil, image.CommitOptions{Name: "test/base", Digest: vmmapi.BuildDigest("base"), Source: "test"})
	if err != nil {
		t.Fatal(err)
	}
	none := func(string) bool { return false }

	// Step 1 runs in a builder on the image; step 2 in a later builder started on step 1's layer.
	work := t.TempDir()
	disk1 := filepath.Join(work, "disk1.qcow2")
	if err := image.NewOverlay(base.Path, disk1); err != nil {
		t.Fatal(err)
	}
	write(t, disk1, "1M", 'B')
	l1, err := image.SaveLayer(ctx, h, image.LayerKey(stepKey(1)), disk1, base.Key, 0, none)
	if err != nil {
		t.Fatal(err)
	}
	write(t, disk1, "2M", 'X') // the builder goes on: the layer keeps the step's state
	if l1.Format != "qcow2" || l1.Key != image.LayerKey(stepKey(1)) {
		t.Fatalf("layer %+v", l1)
	}
	if got, err := image.Resolve(h, l1.Key); err != nil || got.Path != l1.Path {
		t.Fatalf("resolve the layer: %v, %+v", err, got)
	}
	disk2 := filepath.Join(work, "disk2.qcow2")
	if err := image.NewOverlay(l1.Path, disk2); err != nil {
		t.Fatal(err)
	}
	write(t, disk2, "3M", 'C')
	l2, err := image.SaveLayer(ctx, h, image.LayerKey(stepKey(2)), disk2, l1.Key, 0, none)
	if err != nil {
		t.Fatal(err)
	}
	if chain := image.LayerChain(h, l2.Key); !slices.Equal(chain, []string{l2.Key, l1.Key, base.Key}) {
		t.Errorf("chain %v", chain)
	}

	// The result is flattened into an image of its own.
	flat := filepath.Join(t.TempDir(), "final.ext4")
	if err := image.Flatten(ctx, l2, flat); err != nil {
		t.Fatal(err)
	}
	final, err := image.Commit(ctx, h, flat, nil, image.CommitOptions{Name: "test/final", Digest: vmmapi.BuildDigest("final"), Source: "test"})
	if err != nil {
		t.Fatal(err)
	}
	check := func(path string) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for off, want := range map[int]byte{0: 'A', 1 << 20: 'B', 2 << 20: 'A', 3 << 20: 'C'} {
			if b[off] != want || b[off+65535] != want {
				t.Errorf("%s at %d: %q, want %q", filepath.Base(path), off, b[off], want)
			}
		}
	}
	check(final.Path)

	// Pruning keeps what a sandbox uses and what another layer stands on.
	if removed := image.PruneLayers(h, -1, func(k string) bool { return k == l2.Key }); len(removed) != 0 {
		t.Errorf("pruned %v while a sandbox uses the top layer", removed)
	}
	if removed := image.PruneLayers(h, -1, func(k string) bool { return k == l1.Key }); !slices.Equal(removed, []string{l2.Key}) {
		t.Errorf("pruned %v, want only the unused top layer", removed)
	}
	if removed := image.PruneLayers(h, 1<<40, none); len(removed) != 0 {
		t.Errorf("pruned %v under the size bound", removed)
	}
	if removed := image.PruneLayers(h, -1, none); !slices.Equal(removed, []string{l1.Key}) {
		t.Errorf("pruned %v, want the last layer", removed)
	}
	if _, err := image.Resolve(h, l2.Key); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a pruned layer resolves: %v", err)
	}
	check(final.Path) // the image never depended on the layers

	// A layer whose base image is removed is dropped when next looked at.
	l1, err = image.SaveLayer(ctx, h, image.LayerKey(stepKey(1)), disk1, base.Key, 0, none)
	if err != nil {
		t.Fatal(err)
	}
	if err := image.RemoveRef(h, "test/base"); err != nil {
		t.Fatal(err)
	}
	if _, err := image.Resolve(h, l1.Key); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a layer over a removed image resolves: %v", err)
	}
	if _, err := os.Stat(l1.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the broken layer's file is left: %v", err)
	}

	// An interrupted save (its temporary file, or a file renamed without its record) is no
	// layer, and goes once it is an hour old.
	dir := filepath.Dir(l1.Path)
	orphan := filepath.Join(dir, image.LayerKey(stepKey(3))+".qcow2")
	tmp := filepath.Join(dir, ".tmp-"+image.LayerKey(stepKey(4))+"-1.qcow2")
	for _, p := range []string{orphan, tmp} {
		if err := os.WriteFile(p, []byte("QFI\xfb"), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := image.Resolve(h, image.LayerKey(stepKey(3))); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a layer without its record resolves: %v", err)
	}
	old := time.Now().Add(-2 * time.Hour)
	for _, p := range []string{orphan, tmp} {
		os.Chtimes(p, old, old)
	}
	image.PruneLayers(h, 0, none)
	for _, p := range []string{orphan, tmp} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after prune: %v", filepath.Base(p), err)
		}
	}
}

// TestLayerDepth: a layer that would make a chain deeper than MaxLayerDepth is saved flattened,
// with every step's writes.
func TestLayerDepth(t *testing.T) {
	h := layerHome(t)
	ctx := context.Background()
	raw := filepath.Join(t.TempDir(), "base.ext4")
	if err := os.WriteFile(raw, bytes.Repeat([]byte{'A'}, (image.MaxLayerDepth+2)<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	base, err := image.Commit(ctx, h, raw, nil, image.CommitOptions{Name: "test/deep", Digest: vmmapi.BuildDigest("deep"), Source: "test"})
	if err != nil {
		t.Fatal(err)
	}
	parent, path := base.Key, base.Path
	for i := 1; i <= image.MaxLayerDepth+1; i++ {
		disk := filepath.Join(t.TempDir(), "disk.qcow2")
		if err := image.NewOverlay(path, disk); err != nil {
			t.Fatal(err)
		}
		write(t, disk, fmt.Sprintf("%dM", i), byte('a'+i))
		l, err := image.SaveLayer(ctx, h, image.LayerKey(stepKey(byte(i))), disk, parent, 0, func(string) bool { return false })
		if err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		parent, path = l.Key, l.Path
	}
	if chain := image.LayerChain(h, parent); len(chain) != 1 {
		t.Errorf("the layer past the depth bound has the chain %v, want itself only", chain)
	}
	flat := filepath.Join(t.TempDir(), "flat.ext4")
	info, _ := image.Resolve(h, parent)
	if err := image.Flatten(ctx, info, flat); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(flat)
	for i := 1; i <= image.MaxLayerDepth+1; i++ {
		if b[i<<20] != byte('a'+i) {
			t.Errorf("step %d's write lost: %q", i, b[i<<20])
		}
	}
	if b[0] != 'A' {
		t.Errorf("the base lost: %q", b[0])
	}
}
