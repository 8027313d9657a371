package crash_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// The host disk filling up is in the matrix too (issue 19): with $NEXUS_HOME below its
// watermark and a guest writing until the home is full, every operation either works or fails
// with a sentence (one line) and changes nothing; once space is freed every sandbox works, the
// registry is true, nothing half-made is left, and one command finishes each operation.
func TestHostDiskFills(t *testing.T) {
	// The filler has no live mount (it is snapshotted) and a disk of its own (what it writes
	// stays allocated in its overlay).
	quiet, filler := take(t, 1)[0], "crash/disk-filler"
	stack.MustNexus(t, "create", filler, "--image", "nexus-mini", "--memory", "256", "-l", "nexus-test=1")
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", filler) })
	remember(t)

	// Ballast takes the home below the watermark; the filler then fills what is left.
	sp, err := stack.Home.Space()
	if err != nil {
		t.Fatal(err)
	}
	ballast := filepath.Join(stack.Home.String(), "ballast")
	f, err := os.Create(ballast)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(ballast)
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(sp.Free)-40<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// Not zeroes, which the qcow2 driver would not store (detect-zeroes).
	out, errOut, code := stack.Nexus(t, "exec", filler, "--", "sh", "-c", `
		tr '\000' x </dev/zero | head -c 1048576 >/tmp/b0
		for i in 1 2 3 4; do cat /tmp/b0 /tmp/b0 >/tmp/b1 && mv /tmp/b1 /tmp/b0; done
		i=0; while [ $i -lt 16 ]; do dd if=/tmp/b0 of=/root/fill bs=1M count=16 seek=$((i*16)) conv=notrunc,fsync 2>/dev/null || break; i=$((i+1)); done
		echo "stopped after $i blocks"`)
	t.Logf("filler: exit %d: %s %s", code, strings.TrimSpace(out), errOut)
	if !strings.Contains(out, "stopped after") || strings.Contains(out, "after 16 blocks") {
		t.Fatalf("the home did not fill: exit %d, %q %q", code, out, errOut)
	}

	// Operations on a full disk: each works or says why in one line.
	const snap = "crash-diskfull"
	t.Cleanup(func() { stack.Nexus(t, "snapshot", "rm", snap) })
	ops := [][]string{
		{"exec", quiet, "--", "echo", "alive"},
		{"snapshot", "create", filler, snap},
		{"stop", quiet},
		createArgs("crash/disk-new"),
	}
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", "crash/disk-new") })
	failed := map[int]bool{}
	errs := map[int]string{}
	for i, args := range ops {
		out, errOut, code := stack.Nexus(t, args...)
		errs[i] = errOut
		t.Logf("on a full disk: nexus %s: exit %d %s%s", strings.Join(args, " "), code, strings.TrimSpace(out), strings.TrimSpace(errOut))
		if code != 0 {
			failed[i] = true
			if msg := strings.TrimSpace(errOut); msg == "" || strings.Contains(msg, "\n") {
				t.Errorf("nexus %s failed on a full disk without a one-line reason: %q", strings.Join(args, " "), errOut)
			}
		}
	}
	for _, i := range []int{1, 3} {
		if !failed[i] || !strings.Contains(errs[i], "host disk full") {
			t.Errorf("nexus %s was not refused below the disk watermark for that reason: %q", strings.Join(ops[i], " "), errs[i])
		}
	}

	os.Remove(ballast)
	stack.MustNexus(t, "exec", filler, "--", "rm", "-f", "/root/fill")
	remember(t)
	// Every sandbox works again and the registry is true; the one command of each operation
	// that failed finishes it.
	testutil.WaitFor(t, time.Minute, func() error {
		for _, n := range []string{quiet, filler} {
			s := find(t, n)
			if s == nil {
				return fmt.Errorf("%s is gone", n)
			}
			if s.State != api.StateRunning && s.State != api.StateStopped {
				return fmt.Errorf("%s is %s (%s) after the disk was freed", n, s.State, s.Reason)
			}
		}
		return nil
	})
	checkConsistent(t)
	checkSnapshots(t)
	if failed[1] {
		stack.MustNexus(t, "snapshot", "create", filler, snap)
		checkSnapshots(t)
	}
	if s := find(t, quiet); s.State != api.StateStopped {
		stack.MustNexus(t, "stop", quiet)
	}
	stack.MustNexus(t, "start", quiet)
	stack.MustNexus(t, createArgs("crash/disk-new")...)
	for _, n := range []string{quiet, filler, "crash/disk-new"} {
		if out := stack.MustNexus(t, "exec", n, "--", "echo", "alive"); out != "alive\n" {
			t.Errorf("%s after the disk was freed: %q", n, out)
		}
	}
	checkConsistent(t)
	stack.MustNexus(t, "rm", "--force", "crash/disk-new")
	give(t, quiet)
}
