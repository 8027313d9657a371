package qemu

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCgroupRemoveLayouts: remove deletes a VM's group as this build names it
// (<group>/nexus-vm-<id>-<hash>) and as builds before did (<group>/nexus-vms/<id>-<hash>, kept by a
// VM they started and this vmm re-adopted), and nothing else a vm.json could name.
func TestCgroupRemoveLayouts(t *testing.T) {
	old := cgroupRoot
	cgroupRoot = t.TempDir()
	t.Cleanup(func() { cgroupRoot = old })
	flat := filepath.Join(cgroupRoot, "cpu", cgroupName("sb-1", "/home/x/sandboxes/sb-1"))
	legacy := filepath.Join(cgroupRoot, "memory", legacyVMsGroup, "sb-1-0a0b0c0d")
	other := filepath.Join(cgroupRoot, "pids", "system.slice")
	outside := filepath.Join(t.TempDir(), cgroupPrefix+"sb-1")
	for _, d := range []string{flat, legacy, other, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cg := &vmCgroup{Dirs: map[string]string{"cpu": flat, "memory": legacy, "pids": other, "io": outside}}
	if err := cg.remove(); err != nil {
		t.Fatal(err)
	}
	for d, gone := range map[string]bool{flat: true, legacy: true, other: false, outside: false} {
		if _, err := os.Stat(d); os.IsNotExist(err) != gone {
			t.Errorf("%s: removed %v, want %v", d, os.IsNotExist(err), gone)
		}
	}
}
