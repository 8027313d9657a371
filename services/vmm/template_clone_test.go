package vmm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// A clone's overlay is a copy of the one the first clone made, and the same bytes as qemu-img
// makes for it.
func TestCloneOverlayCopiesThePrototype(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("no qemu-img")
	}
	ctx := context.Background()
	dir := t.TempDir()
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", diskFile(dir), "64M").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	a, b, want := filepath.Join(dir, "a.qcow2"), filepath.Join(dir, "b.qcow2"), filepath.Join(dir, "want.qcow2")
	if err := cloneOverlay(ctx, dir, a); err != nil {
		t.Fatal(err)
	}
	proto, err := os.ReadFile(cloneDiskFile(dir))
	if err != nil {
		t.Fatalf("no prototype after the first clone: %v", err)
	}
	if fi, err := os.Stat(cloneDiskFile(dir)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the prototype's mode: %v %v, want 0600 as every file in the home", fi.Mode(), err)
	}
	os.WriteFile(b, []byte("stale"), 0o600) // replaced, not appended to
	if err := cloneOverlay(ctx, dir, b); err != nil {
		t.Fatal(err)
	}
	if err := overlayOn(ctx, diskFile(dir), want); err != nil {
		t.Fatal(err)
	}
	w, _ := os.ReadFile(want)
	for _, f := range []string{a, b} {
		if got, _ := os.ReadFile(f); !bytes.Equal(got, w) || !bytes.Equal(got, proto) {
			t.Errorf("%s: %d bytes, not qemu-img's %d", filepath.Base(f), len(got), len(w))
		}
	}
	if out, err := exec.Command("qemu-img", "info", "--backing-chain", b).CombinedOutput(); err != nil || !bytes.Contains(out, []byte(diskFile(dir))) {
		t.Errorf("qemu-img info: %v: %s", err, out)
	}
}
