package contain_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestMountOwnerKeepsFiles: what the guest writes into a host mount stays owned by the mount's
// owner on the host. 9p is served inside QEMU, so QEMU runs as that owner (not root, not the
// VM uid), still filtered and in its private root, and ps does not call the sandbox less
// contained.
func TestMountOwnerKeepsFiles(t *testing.T) {
	const owner = 61234 // a user with no other part in the tests
	dir := t.TempDir()
	if err := os.Chown(dir, owner, owner); err != nil {
		t.Fatal(err)
	}
	create(t, "jail/usermount", "--mount", dir+":/mnt/host")
	pid := qemuPid(t, "jail/usermount")
	st := status(t, pid)
	if uid := strings.Fields(st["Uid"]); len(uid) < 2 || uid[0] != strconv.Itoa(owner) || uid[1] != strconv.Itoa(owner) {
		t.Errorf("qemu %d runs as uid %q, want the mount's owner %d", pid, st["Uid"], owner)
	}
	if st["Seccomp"] != "2" {
		t.Errorf("qemu %d: Seccomp %q, want 2", pid, st["Seccomp"])
	}
	if c := containment(t, "jail/usermount"); !strings.HasPrefix(c, "contained; ") || !strings.Contains(c, strconv.Itoa(owner)) {
		t.Errorf("ps --json says %q, want contained, naming uid %d", c, owner)
	}
	if _, errOut, _ := stack.Nexus(t, "ps"); strings.Contains(errOut, "jail/usermount") {
		t.Errorf("ps warns about a contained sandbox: %q", errOut)
	}
	out, errOut, code := stack.Nexus(t, "exec", "jail/usermount", "--", "sh", "-c",
		"echo hi >/mnt/host/f && mkdir /mnt/host/d && echo there >/mnt/host/d/g && cat /mnt/host/f /mnt/host/d/g")
	if code != 0 || out != "hi\nthere\n" {
		t.Fatalf("writing into the mount: exit %d %q %q", code, out, errOut)
	}
	for _, p := range []string{"f", "d", "d/g"} {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if s := fi.Sys().(*syscall.Stat_t); s.Uid != owner || s.Gid != owner {
			t.Errorf("the guest's %s is owned by %d:%d on the host, want the mount's owner %d:%d", p, s.Uid, s.Gid, owner, owner)
		}
	}
}
