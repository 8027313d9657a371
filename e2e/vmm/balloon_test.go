package vmm_test

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

// ramFileMiB is how much of the sandbox's RAM file in /dev/shm holds pages: what the VM's
// memory costs the host.
func ramFileMiB(t *testing.T, id string) int64 {
	t.Helper()
	ram, _ := filepath.Glob("/dev/shm/nexus-" + id + "-*/nexus-guest.ram")
	if len(ram) != 1 {
		t.Fatalf("RAM file of %s: %v", id, ram)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(ram[0], &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512 >> 20
}

// A sandbox with a live mount (never snapshotted or forked) gives the host back the memory
// its guest frees: 200 MiB written to a guest tmpfs and removed leave the RAM file within
// seconds (free page reporting), where without it they would stay until the sandbox stops.
func TestMountedSandboxGivesFreedMemoryBack(t *testing.T) {
	create(t, "fpr/box", "--memory", "512m", "--mount", t.TempDir()+":/work")
	id := sandbox(t, "fpr/box").ID
	stack.MustNexus(t, "exec", "fpr/box", "--", "sh", "-c",
		"mkdir -p /mnt/fill && mount -t tmpfs -o size=300m tmpfs /mnt/fill && dd if=/dev/zero of=/mnt/fill/x bs=1M count=200 2>/dev/null")
	full := ramFileMiB(t, id)
	if full < 200 {
		t.Fatalf("the RAM file holds %d MiB after the guest filled 200 MiB of tmpfs", full)
	}
	stack.MustNexus(t, "exec", "fpr/box", "--", "rm", "/mnt/fill/x")
	var now int64
	testutil.WaitFor(t, 30*time.Second, func() error {
		if now = ramFileMiB(t, id); now > full-150 {
			return fmt.Errorf("the RAM file still holds %d MiB (%d MiB full) after the guest freed 200 MiB: freed memory is not given back", now, full)
		}
		return nil
	})
	t.Logf("RAM file: %d MiB full, %d MiB after the guest freed 200 MiB", full, now)
	// The guest still works, and its memory is whole: it can fill the freed space again.
	if out := stack.MustNexus(t, "exec", "fpr/box", "--", "sh", "-c", "dd if=/dev/zero of=/mnt/fill/y bs=1M count=200 2>/dev/null && echo ok"); out != "ok\n" {
		t.Fatalf("refilling after the report: %q", out)
	}
	if got := ramFileMiB(t, id); got < 200 {
		t.Fatalf("RAM file %d MiB after refilling 200 MiB", got)
	}
}
