package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The cache mode of a virtiofs worktree is chosen (issue 24) and pinned here: cache=auto drops
// file data at each open and caches entries and attributes for 0.5 s, so a host edit shows in
// the guest within 1 s (e2e/contain checks it with a guest).
func TestVirtiofsdArgsPinCacheMode(t *testing.T) {
	d := &Driver{cfg: Config{Virtiofsd: DefaultVirtiofsd}}
	spec := &VMSpec{Dir: "/h/sb", Mounts: []Mount{{HostPath: "/src/a"}, {HostPath: "/src/b", Virtiofs: true}}}
	got := strings.Join(d.virtiofsdArgs(spec, 1), " ")
	for _, want := range []string{DefaultVirtiofsd + " ", "--socket-path=vfs1.sock ", "-o source=/src/b", "-o sandbox=namespace",
		"-o cache=auto", "-o timeout=0.5", "-o no_posix_lock", "-o no_xattr"} {
		if !strings.Contains(got, want) {
			t.Errorf("virtiofsd %q lacks %q", got, want)
		}
	}
}

func TestCommandLineVirtiofs(t *testing.T) {
	spec := &VMSpec{ID: "x", Dir: "/h/sb", Kernel: "/k", Initrd: "/i", MemoryMiB: 256, VCPUs: 1,
		Mounts: []Mount{{HostPath: "/src/a"}, {HostPath: "/src/b", Virtiofs: true}}}
	a := commandLine(spec, AccelTCG, "/dev/shm/r", time.Now())
	line := strings.Join(a, " ")
	for _, want := range []string{
		"-global virtio-mmio.force-legacy=false",
		"-chardev socket,id=vfs1,path=/h/sb/vfs1.sock -device vhost-user-fs-device,chardev=vfs1,tag=nexus1",
		"-fsdev local,id=fs0,path=/src/a,security_model=none -device virtio-9p-device,fsdev=fs0,mount_tag=nexus0",
		"share=on",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("qemu %q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "/src/b,") {
		t.Errorf("the virtiofs share is also exported over 9p: %q", line)
	}
	spec.Mounts[1].Virtiofs = false
	if a := commandLine(spec, AccelTCG, "/dev/shm/r", time.Now()); slices.Contains(a, "virtio-mmio.force-legacy=false") {
		t.Error("a machine without virtiofs gets modern virtio-mmio transports (its saved state would change layout)")
	}
}

func TestSettleVirtiofs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the jail (and so virtiofs) needs root")
	}
	share := t.TempDir()
	os.Chmod(filepath.Dir(share), 0o755)
	os.Chown(share, 61236, 61236)
	want := func(d *Driver, incoming bool, uid int, exp bool) {
		t.Helper()
		spec := &VMSpec{Incoming: incoming, Mounts: []Mount{{HostPath: share, Virtiofs: true}, {HostPath: share}}}
		d.settleVirtiofs(spec, uid, uid)
		if spec.Mounts[0].Virtiofs != exp || spec.Mounts[1].Virtiofs {
			t.Errorf("virtiofs %v (incoming %v, uid %d), want %v", spec.Mounts[0].Virtiofs, incoming, uid, exp)
		}
	}
	on := &Driver{cfg: Config{Virtiofsd: DefaultVirtiofsd, JailHelper: "/nexus"}}
	want(on, false, 61236, true)
	want(on, true, 61236, false)                                                 // a restore
	want(on, false, 61000, false)                                                // QEMU is not the share's owner
	want(&Driver{cfg: Config{JailHelper: "/nexus"}}, false, 61236, false)        // no virtiofsd
	want(&Driver{cfg: Config{Virtiofsd: DefaultVirtiofsd}}, false, 61236, false) // not jailed
	os.Chmod(filepath.Dir(share), 0o700)
	want(on, false, 61236, false) // the owner cannot reach it
}
