package vmm

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

func TestCPUSecondsOfThisProcess(t *testing.T) {
	// Burn a little CPU so the figure cannot be zero.
	x := 0
	for i := range 200_000_000 {
		x += i
	}
	_ = x
	if got := cpuSeconds(os.Getpid()); got <= 0 {
		t.Fatalf("cpuSeconds(self) = %v after a busy loop", got)
	}
	if got := cpuSeconds(1 << 30); got != 0 {
		t.Fatalf("cpuSeconds(no such pid) = %v", got)
	}
}

func TestDiskUsageOfAQcow2(t *testing.T) {
	testutil.RequireQEMU(t)
	p := filepath.Join(t.TempDir(), "d.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", p, "3G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	used, size := diskUsage(p)
	if size != 3<<30 {
		t.Errorf("virtual size %d, want %d", size, int64(3<<30))
	}
	if used <= 0 || used > 10<<20 {
		t.Errorf("an empty qcow2 takes %d bytes on the host", used)
	}
	if u, s := diskUsage(filepath.Join(t.TempDir(), "none")); u != 0 || s != 0 {
		t.Errorf("a missing disk: %d, %d", u, s)
	}
}
