package contain_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

// virtiofsd finds the daemon the vmm started for the sandbox (its environment names the sandbox
// directory) and the one it forked into its own namespaces.
func virtiofsd(t *testing.T, name string) (pids []int, argv []string) {
	t.Helper()
	dir := stack.Home.Sandbox(sandboxID(t, name))
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		comm, _ := os.ReadFile(p + "/comm")
		env, _ := os.ReadFile(p + "/environ")
		if !bytes.HasPrefix(comm, []byte("virtiofsd")) || !bytes.Contains(env, []byte("NEXUS_VIRTIOFS_SANDBOX="+dir+"\x00")) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(p))
		b, _ := os.ReadFile(p + "/cmdline")
		pids = append(pids, pid)
		argv = strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	}
	return pids, argv
}

// guestWait runs a loop in the guest that waits (by the guest's clock, up to 5 s) until cond
// holds and prints how long that took in ms; -1 when it never did.
func guestWait(t *testing.T, name, cond string) int {
	t.Helper()
	script := `up() { read u _ </proc/uptime; echo "${u%.*}${u#*.}0"; }; s=$(up); i=0
until ` + cond + `; do i=$((i+1)); [ $i -gt 500 ] && { echo -1; exit; }; sleep 0.01; done; echo $(( $(up) - s ))`
	out, errOut, code := stack.Nexus(t, "exec", name, "--", "sh", "-c", script)
	ms, err := strconv.Atoi(strings.TrimSpace(out))
	if code != 0 || err != nil {
		t.Fatalf("guest wait for %s: exit %d %q %q", cond, code, out, errOut)
	}
	return ms
}

// TestVirtiofsLiveMount (issue 24): a --mount worktree is served over virtiofs by a virtiofsd
// holding no more than the mount owner's privileges, with the cache mode pinned, and with the
// coherence a user relies on: a host edit is seen by the guest within 1 s, a guest write is on
// the host when the command returns. A virtiofsd that dies stops the sandbox (no dead mount).
func TestVirtiofsLiveMount(t *testing.T) {
	if _, err := os.Stat("/usr/lib/qemu/virtiofsd"); err != nil {
		t.Skip("no virtiofsd: mounts are 9p here")
	}
	const owner = 61235
	dir := t.TempDir()
	os.Chmod(dir, 0o755) // as a home is: the owner can reach the share
	os.Chmod(filepath.Dir(dir), 0o755)
	share := filepath.Join(dir, "share")
	os.Mkdir(share, 0o755)
	os.WriteFile(filepath.Join(share, "f"), []byte("v1\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "outside"), []byte("host secret\n"), 0o644)
	os.Symlink(filepath.Join(dir, "outside"), filepath.Join(share, "esc"))
	for _, p := range []string{share, filepath.Join(share, "f")} {
		if err := os.Lchown(p, owner, owner); err != nil {
			t.Fatal(err)
		}
	}
	const name = "vfs/live"
	create(t, name, "--mount", share+":/mnt/host")

	t.Run("pinned", func(t *testing.T) {
		out := stack.MustNexus(t, "exec", name, "--", "grep", " /mnt/host ", "/proc/mounts")
		if f := strings.Fields(out); len(f) < 3 || f[0] != "nexus0" || f[2] != "virtiofs" {
			t.Errorf("the guest mounts %q, want the tag nexus0 over virtiofs", out)
		}
		pids, argv := virtiofsd(t, name)
		if len(pids) == 0 {
			t.Fatal("no virtiofsd serves the sandbox")
		}
		args := " " + strings.Join(argv, " ") + " "
		for _, want := range []string{" -o cache=auto ", " -o timeout=0.5 ", " -o sandbox=namespace ", " -o source=" + share + " "} {
			if !strings.Contains(args, want) {
				t.Errorf("virtiofsd runs %q, want %q in it", args, want)
			}
		}
		for _, pid := range pids {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
			if m := strings.Fields(string(b)); len(m) != 3 || m[0] != "0" || m[1] != strconv.Itoa(owner) || m[2] != "1" {
				t.Errorf("virtiofsd %d: uid_map %q, want only root mapped to the owner %d", pid, b, owner)
			}
			if g := status(t, pid)["Groups"]; g != "" {
				t.Errorf("virtiofsd %d keeps supplementary groups %q", pid, g)
			}
		}
	})

	t.Run("guest-write-on-host", func(t *testing.T) {
		stack.MustNexus(t, "exec", name, "--", "sh", "-c", "mkdir -p /mnt/host/d && printf w >/mnt/host/d/g")
		b, err := os.ReadFile(filepath.Join(share, "d", "g"))
		if err != nil || string(b) != "w" {
			t.Fatalf("right after the exec the host reads %q (%v), want %q", b, err, "w")
		}
		for _, p := range []string{"d", "d/g"} {
			fi, err := os.Stat(filepath.Join(share, p))
			if err != nil {
				t.Fatal(err)
			}
			if s := fi.Sys().(*syscall.Stat_t); s.Uid != owner || s.Gid != owner {
				t.Errorf("the guest's %s is owned by %d:%d on the host, want the owner %d", p, s.Uid, s.Gid, owner)
			}
		}
	})

	t.Run("host-edit-seen", func(t *testing.T) {
		// The guest has the file's data, attributes and the absence of "new" cached first.
		stack.MustNexus(t, "exec", name, "--", "sh", "-c", "cat /mnt/host/f; ls -l /mnt/host; test ! -e /mnt/host/new")
		os.WriteFile(filepath.Join(share, "f"), []byte("v2\n"), 0o644) // same size: only the data changed
		os.WriteFile(filepath.Join(share, "new"), []byte("n\n"), 0o644)
		if ms := guestWait(t, name, `[ "$(cat /mnt/host/f)" = v2 ]`); ms < 0 || ms > 1000 {
			t.Errorf("the guest saw the host's edit after %d ms, want within 1000", ms)
		}
		if ms := guestWait(t, name, `[ -e /mnt/host/new ]`); ms < 0 || ms > 1000 {
			t.Errorf("the guest saw the host's new file after %d ms, want within 1000", ms)
		}
	})

	t.Run("no-escape", func(t *testing.T) {
		out, _, _ := stack.Nexus(t, "exec", name, "--", "sh", "-c", "cat /mnt/host/esc /mnt/host/../outside "+filepath.Join(dir, "outside")+" 2>/dev/null")
		if strings.Contains(out, "host secret") {
			t.Errorf("the guest read a host file outside the share through it: %q", out)
		}
	})

	// Last: it stops the sandbox.
	t.Run("dead-daemon-stops-sandbox", func(t *testing.T) {
		pids, _ := virtiofsd(t, name)
		if len(pids) == 0 {
			t.Fatal("no virtiofsd")
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		testutil.WaitFor(t, 60*time.Second, func() error {
			if s := state(t, name); s == "running" {
				return fmt.Errorf("state %s", s)
			}
			return nil
		})
		if r := reason(t, name); !strings.Contains(r, "virtiofsd") {
			t.Errorf("the sandbox stopped for %q, want its virtiofsd named", r)
		}
	})
}
