package contain_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

// status reads the fields of /proc/PID/status.
func status(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func containment(t *testing.T, name string) string {
	t.Helper()
	var list []struct {
		Name        string `json:"name"`
		Containment string `json:"containment"`
	}
	out := stack.MustNexus(t, "ps", "--json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.Name == name {
			return s.Containment
		}
	}
	return ""
}

// TestQEMUContained checks from the host what a guest that escapes into QEMU would have: a
// uid that is not root, QEMU's seccomp filter, a private root holding its own sandbox's files and
// not its neighbour's nor the host's, and a cgroup of its own.
func TestQEMUContained(t *testing.T) {
	create(t, "jail/a")
	create(t, "jail/b")
	pid := qemuPid(t, "jail/a")
	st := status(t, pid)
	if uid := strings.Fields(st["Uid"]); len(uid) == 0 || uid[0] == "0" || uid[1] == "0" {
		t.Errorf("qemu %d runs as uid %q", pid, st["Uid"])
	}
	if st["Seccomp"] != "2" {
		t.Errorf("qemu %d: Seccomp %q, want 2 (filtered)", pid, st["Seccomp"])
	}
	if st["NoNewPrivs"] != "1" {
		t.Errorf("qemu %d: NoNewPrivs %q", pid, st["NoNewPrivs"])
	}
	root := fmt.Sprintf("/proc/%d/root", pid)
	own := stack.Home.Sandbox(sandboxID(t, "jail/a"))
	other := stack.Home.Sandbox(sandboxID(t, "jail/b"))
	if _, err := os.Stat(filepath.Join(root, own, "disk.qcow2")); err != nil {
		t.Errorf("its own disk is not in its root: %v", err)
	}
	// A file of the host's own, outside every path the jail binds.
	hostDir := t.TempDir()
	hostFile := filepath.Join(hostDir, "host-only")
	if err := os.WriteFile(hostFile, []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{other, filepath.Join(other, "disk.qcow2"), "/etc/passwd", hostFile, stack.Home.String() + "/bus"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s is visible in qemu's root", p)
		}
	}
	for _, d := range []string{"/root", "/work", hostDir} {
		checkHidden(t, root, d)
	}
	if entries, err := os.ReadDir(filepath.Join(root, "proc")); err == nil {
		for _, e := range entries {
			if e.Name() != "1" && strings.Trim(e.Name(), "0123456789") == "" {
				t.Errorf("qemu sees process %s beside itself", e.Name())
			}
		}
	}
	if c := containment(t, "jail/a"); c != "contained" {
		t.Errorf("ps says %q, want contained", c)
	}
	execOK(t, "jail/a")
}

// checkHidden checks that the host directory dir shows in QEMU's root (the directory root) at
// most as the way to the download cache: the jail binds the kernel and initramfs at their host
// paths, and the cache may be anywhere ($NEXUS_CACHE under /work, the default under /root), so
// an ancestor of it is there holding that one entry and nothing else of the host's.
func checkHidden(t *testing.T, root, dir string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, dir))
	if err != nil {
		return // not there at all
	}
	rel, err := filepath.Rel(dir, testutil.CacheDir())
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		t.Errorf("%s is visible in qemu's root", dir)
		return
	}
	toCache, _, _ := strings.Cut(rel, "/")
	for _, e := range entries {
		if e.Name() != toCache {
			t.Errorf("%s is visible in qemu's root", filepath.Join(dir, e.Name()))
		}
	}
}

// TestRootMountLessContained: a root-owned host mount is served by QEMU over 9p, so QEMU runs as
// root there, and ps says the sandbox is less contained.
func TestRootMountLessContained(t *testing.T) {
	dir := t.TempDir() // owned by root: the tests run as root
	create(t, "jail/mount", "--mount", dir+":/mnt/host")
	if c := containment(t, "jail/mount"); !strings.HasPrefix(c, "less contained: ") || !strings.Contains(c, dir) {
		t.Fatalf("ps --json says %q, want less contained naming %s", c, dir)
	}
	_, errOut, _ := stack.Nexus(t, "ps")
	if !strings.Contains(errOut, "jail/mount is less contained: ") {
		t.Fatalf("ps does not say jail/mount is less contained: %q", errOut)
	}
	out, _, code := stack.Nexus(t, "exec", "jail/mount", "--", "sh", "-c", "echo hi > /mnt/host/f && cat /mnt/host/f")
	if code != 0 || out != "hi\n" {
		t.Fatalf("the mount does not work: %d %q", code, out)
	}
}
