package crash_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// A host reboot, simulated: nexus and every QEMU killed, nexus's guest RAM in /dev/shm wiped.
// After it no record claims to run: each ends failed with the reason and nothing of its
// perimeter left, its disk intact; one `nexus start` brings them all back with what their
// guests had written to disk.
func TestHostReboot(t *testing.T) {
	names := take(t, 2) // the first runs, the second is paused
	for _, n := range names {
		stack.MustNexus(t, "exec", n, "--", "sh", "-c", "echo kept > /kept && sync")
	}
	stack.MustNexus(t, "pause", names[1])
	var pids []int
	var ids []string
	for _, n := range names {
		s := find(t, n)
		ids = append(ids, s.ID)
		pids = append(pids, qemuPid(t, s.ID))
	}
	stack.Kill()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
		testutil.WaitFor(t, 30*time.Second, func() error {
			if syscall.Kill(pid, 0) == nil {
				return errors.New("QEMU is still there")
			}
			return nil
		})
	}
	for _, id := range ids {
		ram, _ := filepath.Glob("/dev/shm/nexus-" + id + "-*.ram")
		for _, f := range ram {
			os.Remove(f)
		}
	}
	if err := stack.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if s := find(t, n); s.State != api.StateFailed && s.State != api.StateStopped || s.State == api.StateFailed && s.Reason == "" {
			t.Errorf("after the reboot %s is %s (%q)", n, s.State, s.Reason)
		}
	}
	checkConsistent(t)
	stack.MustNexus(t, append([]string{"start"}, names...)...)
	for _, n := range names {
		if out := stack.MustNexus(t, "exec", n, "--", "cat", "/kept"); out != "kept\n" {
			t.Errorf("after the reboot %s's disk has %q", n, out)
		}
	}
	checkConsistent(t)
	give(t, names...)
}
