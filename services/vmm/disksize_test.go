package vmm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/image"
)

// A root disk the home could not hold is refused with the numbers; one that fits is not.
func TestDiskFits(t *testing.T) {
	sp := home.Space{Free: 5 << 30, Total: 20 << 30}
	if err := diskFits("/h", sp, 5<<10); err != nil {
		t.Fatalf("a 5 GiB disk on 5 GiB free: %v", err)
	}
	err := diskFits("/h", sp, 6<<10)
	if !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("a 6 GiB disk on 5 GiB free: %v, want refused", err)
	}
	want := "not enough free disk for 6.0 GiB of new disks: /h has 5.0 GiB free of 20.0 GiB; ask for less --disk or free space there"
	if err.Error() != want {
		t.Fatalf("refusal %q, want %q", err, want)
	}
}

// The overlay's virtual size is the disk asked for; one smaller than the image is refused.
func TestOverlaySized(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("no qemu-img")
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "base.ext4")
	if err := os.WriteFile(base, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(base, 64<<20); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "disk.qcow2")
	if err := image.NewOverlaySized(base, disk, 3<<30); err != nil {
		t.Fatal(err)
	}
	if _, size := diskUsage(disk); size != 3<<30 {
		t.Fatalf("virtual size %d, want 3 GiB", size)
	}
	err := image.NewOverlaySized(base, filepath.Join(dir, "small.qcow2"), 32<<20)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "smaller than the image's 64 MiB file system") {
		t.Fatalf("a 32 MiB disk over a 64 MiB image: %v", err)
	}
}
