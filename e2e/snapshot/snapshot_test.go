package snapshot_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// create boots a nexus-mini sandbox and removes it when t ends.
func create(t *testing.T, name string, args ...string) {
	t.Helper()
	stack.MustNexus(t, append([]string{"create", name, "--image", "nexus-mini", "--memory", "256"}, args...)...)
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", name) })
}

func fork(t *testing.T, snap, name string) {
	t.Helper()
	stack.MustNexus(t, "fork", snap, name)
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", name) })
}

func snapshot(t *testing.T, sandbox, snap string) {
	t.Helper()
	stack.MustNexus(t, "snapshot", "create", sandbox, snap)
	t.Cleanup(func() { stack.Nexus(t, "snapshot", "rm", snap) })
}

// counterScript runs a detached counter that writes its value to /tmp/count every 100 ms.
const counterScript = `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1 &`

func count(t *testing.T, name string) int {
	t.Helper()
	out := stack.MustNexus(t, "exec", name, "--", "sh", "-c", "cat /tmp/count 2>/dev/null || echo 0") // 0: not started yet
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("%s: /tmp/count is %q", name, out)
	}
	return n
}

// waitCount polls until the counter in name passes above.
func waitCount(t *testing.T, name string, above int) int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		n := count(t, name)
		if n > above {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: counter stuck at %d (want > %d)", name, n, above)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestForksKeepCountingIndependently(t *testing.T) {
	create(t, "snap/parent", "--allow-host", "example.com")
	stack.MustNexus(t, "exec", "snap/parent", "--", "sh", "-c", counterScript)
	waitCount(t, "snap/parent", 3)
	snapshot(t, "snap/parent", "counting")
	atSnap := count(t, "snap/parent")
	fork(t, "counting", "snap/a")
	fork(t, "counting", "snap/b")

	// Each fork resumed the parent's counter from (about) the snapshot's value, not from 1, and
	// keeps counting on its own.
	for _, n := range []string{"snap/a", "snap/b"} {
		c := count(t, n)
		if c < 3 || c > atSnap+600 {
			t.Fatalf("%s: counter %d right after the fork; the parent was at %d when snapshotted", n, c, atSnap)
		}
		waitCount(t, n, c)
		if h := strings.TrimSpace(stack.MustNexus(t, "exec", n, "--", "hostname")); h != strings.TrimPrefix(n, "snap/") {
			t.Errorf("%s: hostname %q", n, h)
		}
	}
	waitCount(t, "snap/parent", atSnap)

	// Isolated: a file written in a is in neither b nor the parent, which keep counting.
	stack.MustNexus(t, "exec", "snap/a", "--", "sh", "-c", "echo only-in-a > /root/marker")
	for _, n := range []string{"snap/b", "snap/parent"} {
		waitCount(t, n, count(t, n))
		out, _, code := stack.Nexus(t, "exec", n, "--", "cat", "/root/marker")
		if code == 0 || strings.Contains(out, "only-in-a") {
			t.Errorf("%s sees the file written in snap/a: %q (exit %d)", n, out, code)
		}
	}
	if out := stack.MustNexus(t, "exec", "snap/a", "--", "cat", "/root/marker"); out != "only-in-a\n" {
		t.Errorf("snap/a lost its own file: %q", out)
	}

	// Each fork has its own record, id and perimeter.
	var list []api.SandboxView
	json.Unmarshal([]byte(stack.MustNexus(t, "ps", "--json")), &list)
	ids := map[string]string{}
	for _, s := range list {
		ids[s.Name] = s.ID
		if (s.Name == "snap/a" || s.Name == "snap/b") && (s.State != api.StateRunning || s.Egress.Mode != api.EgressCurated) {
			t.Errorf("%s: state %s egress %s", s.Name, s.State, s.Egress.Mode)
		}
	}
	if ids["snap/a"] == "" || ids["snap/a"] == ids["snap/b"] || ids["snap/a"] == ids["snap/parent"] {
		t.Errorf("fork ids: %v", ids)
	}
	if out := stack.MustNexus(t, "egress", "show", "snap/b"); !strings.Contains(out, "example.com") {
		t.Errorf("snap/b has no perimeter of its own:\n%s", out)
	}
}

func TestSnapshotRemoveRefusedWhileChildLives(t *testing.T) {
	create(t, "rm/parent")
	stack.MustNexus(t, "snapshot", "create", "rm/parent", "held")
	stack.MustNexus(t, "fork", "held", "rm/child")
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", "rm/child"); stack.Nexus(t, "snapshot", "rm", "held") })
	// A stopped fork does not hold the snapshot: rm detaches its disk from the snapshot's.
	fork(t, "held", "rm/stopped")
	stack.MustNexus(t, "exec", "rm/stopped", "--", "sh", "-c", "echo survives > /root/mine && sync")
	stack.MustNexus(t, "stop", "rm/stopped")

	out := stack.MustNexus(t, "snapshot", "ls", "--json")
	var views []api.SnapshotView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range views {
		if v.Name == "held" {
			found = true
			if len(v.Children) != 1 || v.Children[0] != "rm/child" || v.Sandbox != "rm/parent" {
				t.Errorf("snapshot ls: %+v", v)
			}
		}
	}
	if !found {
		t.Fatalf("snapshot ls --json has no held: %s", out)
	}
	_, errOut, code := stack.Nexus(t, "snapshot", "rm", "held")
	want := "snapshot held is in use by live sandboxes rm/child: remove them first (there is no --force)"
	if code != 1 || !strings.Contains(errOut, want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
		t.Fatalf("snapshot rm with a live child: exit %d, stderr %q; want one line %q", code, errOut, want)
	}
	if _, err := os.Stat(filepath.Join(string(stack.Home), "snapshots", "held", "ram")); err != nil {
		t.Fatalf("a refused rm changed the snapshot: %v", err)
	}
	if out := stack.MustNexus(t, "exec", "rm/child", "--", "echo", "alive"); out != "alive\n" {
		t.Fatalf("child after refused rm: %q", out)
	}
	stack.MustNexus(t, "rm", "--force", "rm/child")
	stack.MustNexus(t, "snapshot", "rm", "held")
	if _, err := os.Stat(filepath.Join(string(stack.Home), "snapshots", "held")); !os.IsNotExist(err) {
		t.Fatalf("snapshot directory still there after rm: %v", err)
	}
	if out := stack.MustNexus(t, "snapshot", "ls"); strings.Contains(out, "held") {
		t.Fatalf("snapshot ls after rm:\n%s", out)
	}
	stack.MustNexus(t, "start", "rm/stopped")
	if out := stack.MustNexus(t, "exec", "rm/stopped", "--", "cat", "/root/mine"); out != "survives\n" {
		t.Fatalf("stopped fork after snapshot rm: /root/mine is %q", out)
	}
}

func TestTruncatedRAMRefused(t *testing.T) {
	create(t, "trunc/parent")
	snapshot(t, "trunc/parent", "trunc")
	ram := filepath.Join(string(stack.Home), "snapshots", "trunc", "ram")
	fi, err := os.Stat(ram)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(ram, fi.Size()-4096); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := stack.Nexus(t, "fork", "trunc", "trunc/child")
	want := "snapshot trunc is damaged: its RAM file is " + strconv.FormatInt(fi.Size()-4096, 10) + " bytes, expected " + strconv.FormatInt(fi.Size(), 10) + "; no fork was started"
	if code != 1 || !strings.Contains(errOut, want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
		t.Fatalf("fork of a truncated snapshot: exit %d, stderr %q; want one line %q", code, errOut, want)
	}
	if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "trunc/child") {
		t.Fatalf("a refused fork left a record:\n%s", out)
	}
	if dirs, _ := filepath.Glob(filepath.Join(string(stack.Home), "sandboxes", "*", "snapshot")); len(dirs) != 0 {
		t.Fatalf("a refused fork left a sandbox directory: %v", dirs)
	}
}

func TestMountedSandboxRefused(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	create(t, "mnt/box", "--mount", a+":/work", "--mount", b+":/data:ro")
	pairs := a + "→/work, " + b + "→/data"
	for _, args := range [][]string{
		{"snapshot", "create", "mnt/box", "mnt-snap"},
		{"fork", "mnt/box", "mnt/child"},
	} {
		_, errOut, code := stack.Nexus(t, args...)
		if code != 1 || !strings.Contains(errOut, "has live mounts "+pairs) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("nexus %s: exit %d, stderr %q; want one line naming %s", strings.Join(args, " "), code, errOut, pairs)
		}
	}
	if out := stack.MustNexus(t, "snapshot", "ls"); strings.Contains(out, "mnt") {
		t.Errorf("a refused snapshot was recorded:\n%s", out)
	}
	if left, _ := filepath.Glob(filepath.Join(string(stack.Home), "snapshots", "*mnt*")); len(left) != 0 {
		t.Errorf("a refused snapshot left files: %v", left)
	}
	if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "mnt/child") {
		t.Errorf("a refused fork left a record:\n%s", out)
	}
	if out := stack.MustNexus(t, "exec", "mnt/box", "--", "echo", "ok"); out != "ok\n" {
		t.Errorf("mounted sandbox after refusals: %q", out)
	}
}

func TestNamedVolumeSurvivesStopStart(t *testing.T) {
	create(t, "vol/box", "--mount-named", "cache:/cache,kind=disk")
	stack.MustNexus(t, "exec", "vol/box", "--", "sh", "-c", "grep ' /cache ext4 ' /proc/mounts && echo kept > /cache/file")
	_, errOut, code := stack.Nexus(t, "volume", "rm", "vol/box", "cache")
	if code != 1 || !strings.Contains(errOut, "stop it first") {
		t.Errorf("volume rm of a running sandbox: exit %d, %q", code, errOut)
	}
	stack.MustNexus(t, "stop", "vol/box")
	stack.MustNexus(t, "start", "vol/box")
	if out := stack.MustNexus(t, "exec", "vol/box", "--", "cat", "/cache/file"); out != "kept\n" {
		t.Fatalf("after stop/start /cache/file is %q", out)
	}
	var vols []api.VolumeView
	json.Unmarshal([]byte(stack.MustNexus(t, "volume", "ls", "--json")), &vols)
	if len(vols) == 0 || vols[0].Sandbox != "vol/box" || vols[0].Name != "cache" || vols[0].Guest != "/cache" {
		t.Fatalf("volume ls: %+v", vols)
	}
	stack.MustNexus(t, "stop", "vol/box")
	stack.MustNexus(t, "volume", "rm", "vol/box", "cache")
	if out := stack.MustNexus(t, "volume", "ls"); strings.Contains(out, "cache") {
		t.Fatalf("volume ls after rm:\n%s", out)
	}
	_, errOut, code = stack.Nexus(t, "create", "vol/bad", "--image", "nexus-mini", "--mount-named", "cache:relative")
	if code != 2 || !strings.Contains(errOut, `invalid --mount-named "cache:relative"`) {
		t.Errorf("bad --mount-named: exit %d, %q", code, errOut)
	}
}

// TestProfileCredentialMountSnapshotAndFork: the claude-code profile live-mounts the host's
// ~/.claude; that mount does not block a snapshot: it is dropped for the copy and mounted again
// in the parent, and a fork gets it too, live.
func TestProfileCredentialMountSnapshotAndFork(t *testing.T) {
	dir := filepath.Join(stack.Root, "home", ".claude")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) }) // the package's other sandboxes get no profile mount
	cred := filepath.Join(dir, ".credentials.json")
	os.WriteFile(cred, []byte("v1"), 0o600)
	read := func(name string) string {
		t.Helper()
		return stack.MustNexus(t, "exec", name, "--", "cat", "/root/.claude/.credentials.json")
	}
	create(t, "cred/box")
	if got := read("cred/box"); got != "v1" {
		t.Fatalf("profile mount in the guest: %q", got)
	}
	snapshot(t, "cred/box", "cred-snap")
	os.WriteFile(cred, []byte("v2"), 0o600)
	if got := read("cred/box"); got != "v2" {
		t.Fatalf("parent after the snapshot reads %q: the live mount is not back", got)
	}
	fork(t, "cred-snap", "cred/child")
	if got := read("cred/child"); got != "v2" {
		t.Fatalf("fork reads %q: it does not have the live mount", got)
	}
	stack.MustNexus(t, "exec", "cred/child", "--", "sh", "-c", "echo from-fork > /root/.claude/fork.txt")
	if b, _ := os.ReadFile(filepath.Join(dir, "fork.txt")); string(b) != "from-fork\n" {
		t.Fatalf("the fork's write did not reach the host: %q", b)
	}
}
