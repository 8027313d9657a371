package crash_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// parentName is the sandbox the tests snapshot (no live mount: a mounted sandbox cannot be
// snapshotted), one for the package: a cold boot is most of what a case costs.
const parentName = "crash/parent"

// snapshotParent returns the sandbox to snapshot, running, with a file on its disk that every
// fork of it must have: created once, started again when a test left it stopped.
func snapshotParent(t *testing.T) string {
	t.Helper()
	switch s := find(t, parentName); {
	case s == nil:
		stack.MustNexus(t, "create", parentName, "--image", "nexus-mini", "--memory", "256", "-l", "nexus-test=1")
		stack.MustNexus(t, "exec", parentName, "--", "sh", "-c", "echo parent > /root/mark && sync")
		remember(t)
	case s.State == api.StatePaused:
		stack.MustNexus(t, "resume", parentName)
	case s.State != api.StateRunning:
		stack.MustNexus(t, "start", parentName)
	}
	t.Cleanup(func() { // it waits for the next test paused
		if !t.Failed() {
			idle(t, parentName)
		}
	})
	return parentName
}

// snapshots is `snapshot ls --json`.
func snapshots(t *testing.T) []api.SnapshotView {
	t.Helper()
	out := stack.MustNexus(t, "snapshot", "ls", "--json")
	var list []api.SnapshotView
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("snapshot ls --json: %v: %s", err, out)
	}
	return list
}

// checkSnapshots checks that the snapshot index and the snapshots on disk agree: each record
// has its files and is usable, each snapshot on disk has a record (a restarted stack removes
// one a crash left without, while it starts), and nothing half-made is left.
func checkSnapshots(t *testing.T) {
	t.Helper()
	testutil.WaitFor(t, time.Minute, func() error {
		recorded := map[string]bool{}
		for _, s := range snapshots(t) {
			recorded[s.Name] = true
			if s.Unusable != "" {
				return fmt.Errorf("snapshot %s is listed unusable: %s", s.Name, s.Unusable)
			}
			if _, err := os.Stat(filepath.Join(stack.Home.Snapshots(), s.Name, "snapshot.json")); err != nil {
				return fmt.Errorf("snapshot %s is listed but has no files: %v", s.Name, err)
			}
		}
		ents, _ := os.ReadDir(stack.Home.Snapshots())
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				return fmt.Errorf("%s is left in %s", e.Name(), stack.Home.Snapshots())
			}
			if !recorded[e.Name()] {
				return fmt.Errorf("snapshot %s is on disk without a record", e.Name())
			}
		}
		return nil
	})
}

// checkFork checks that a running fork runs from its snapshot: its parent's disk, its own
// hostname and configuration.
func checkFork(t *testing.T, name string) {
	t.Helper()
	if out, errOut, code := stack.Nexus(t, "exec", name, "--", "cat", "/root/mark"); code != 0 || out != "parent\n" {
		t.Errorf("fork %s does not run from its snapshot: /root/mark is %q (exit %d: %s)", name, out, code, errOut)
	}
}

// A snapshot killed at any step leaves, after the restart, a parent that runs and execs and a
// snapshot that is whole and recorded or gone (never listed half-made, never on disk without a
// record); one `nexus snapshot create` then makes it.
func TestCrashDuringSnapshot(t *testing.T) {
	parent := snapshotParent(t)
	points := []string{"vmm/snapshot/state", "vmm/snapshot/copied", "vmm/snapshot/saved", "gateway/snapshot/vm"}
	for i, point := range points {
		snap := fmt.Sprintf("crash-snap-%d", i)
		t.Run(point, func(t *testing.T) {
			crashAt(t, point, "snapshot", "create", parent, snap)
			checkConsistent(t)
			checkSnapshots(t)
			if s := find(t, parent); s == nil || s.State != api.StateRunning {
				t.Fatalf("after a crash during its snapshot the parent is %+v", s)
			}
			stack.MustNexus(t, "snapshot", "create", parent, snap) // the one command
			checkSnapshots(t)
			stack.MustNexus(t, "snapshot", "rm", snap)
		})
	}
}

// A fork killed at any step ends, after the restart, running from its snapshot (configured,
// with the parent's disk) or failed with the reason and nothing of it running; one `nexus
// start` then brings it up from its snapshot, never cold-booted from the bare image.
func TestCrashDuringFork(t *testing.T) {
	parent := snapshotParent(t)
	snap := "crash-fork"
	stack.MustNexus(t, "snapshot", "create", parent, snap)
	t.Cleanup(func() { stack.Nexus(t, "snapshot", "rm", snap) })
	points := []string{"gateway/fork/recorded", "gateway/boot/starting", "gateway/boot/perimeter",
		"vmm/fork/disk", "vmm/fork/restore", "vmm/fork/agent", "vmm/fork/configure", "vmm/fork/booted", "gateway/fork/vm"}
	for _, point := range points {
		name := caseName("fork", point)
		t.Run(point, func(t *testing.T) {
			t.Cleanup(func() { stack.Nexus(t, "rm", "--force", name) })
			crashAt(t, point, "fork", snap, name)
			checkConsistent(t)
			if s := find(t, name); s != nil && s.State == api.StateRunning {
				checkFork(t, name)
			}
			finishStart(t, name)
			checkFork(t, name)
			rm(t, name)
			checkConsistent(t)
		})
	}
	checkSnapshots(t)
	t.Run("snapshot without RAM", func(t *testing.T) { checkUnusable(t, snap) })
}

// checkUnusable removes the RAM file of snapshot snap: it is then listed unusable with the
// reason, and a fork from it is refused with a sentence saying why, leaving nothing behind.
func checkUnusable(t *testing.T, snap string) {
	if err := os.Remove(filepath.Join(stack.Home.Snapshots(), snap, "ram")); err != nil {
		t.Fatal(err)
	}
	const why = "its RAM file is missing"
	i := slices.IndexFunc(snapshots(t), func(s api.SnapshotView) bool { return s.Name == snap })
	if i < 0 {
		t.Fatal("the snapshot is no longer listed")
	}
	if got := snapshots(t)[i].Unusable; !strings.Contains(got, why) {
		t.Errorf("snapshot ls --json: unusable %q, want it to say %q", got, why)
	}
	if out := stack.MustNexus(t, "snapshot", "ls"); !strings.Contains(out, "snapshot "+snap+" is unusable, no fork can start from it: damaged: "+why) {
		t.Errorf("snapshot ls does not say the snapshot is unusable:\n%s", out)
	}
	_, errOut, code := stack.Nexus(t, "fork", snap, "crash/noram-child")
	if want := "snapshot " + snap + " is damaged: " + why + "; no fork was started"; code == 0 || !strings.Contains(errOut, want) {
		t.Errorf("fork from a snapshot without RAM: exit %d, %q; want %q", code, errOut, want)
	}
	if s := find(t, "crash/noram-child"); s != nil {
		t.Errorf("the refused fork left a record: %s", s.State)
	}
	checkConsistent(t)
}
