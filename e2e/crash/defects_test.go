package crash_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

func qemuPid(t *testing.T, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stack.Home.Sandbox(id), "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// A paused sandbox survives a restart of nexus paused (its guest cannot answer the agent
// while paused), the restarted stack answers at once, and it resumes and execs.
func TestPausedSandboxSurvivesRestart(t *testing.T) {
	name := take(t, 1)[0]
	stack.MustNexus(t, "exec", name, "--", "sh", "-c", "echo before > /tmp/mark")
	stack.MustNexus(t, "pause", name)
	s := find(t, name)
	pid := qemuPid(t, s.ID)
	stack.Kill()
	began := time.Now()
	if err := stack.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("the stack answered %v after the restart began", time.Since(began).Round(time.Millisecond))
	if s := find(t, name); s.State != api.StatePaused {
		t.Fatalf("after the restart the paused sandbox is %s (%s)", s.State, s.Reason)
	}
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("the restart killed the paused VM")
	}
	checkConsistent(t)
	stack.MustNexus(t, "resume", name)
	if out := stack.MustNexus(t, "exec", name, "--", "cat", "/tmp/mark"); out != "before\n" {
		t.Fatalf("after resume the guest has %q", out)
	}
	if qemuPid(t, s.ID) != pid {
		t.Fatal("the VM was replaced")
	}
	checkConsistent(t)
	give(t, name)
}

// The first `nexus start` after a VM failure succeeds: marking the sandbox failed released its
// perimeter, and setting a perimeter up again replaces what a crash may have left.
func TestStartAfterVMFailure(t *testing.T) {
	name := take(t, 1)[0]
	s := find(t, name)
	syscall.Kill(qemuPid(t, s.ID), syscall.SIGKILL)
	testutil.WaitFor(t, time.Minute, func() error {
		if s := find(t, name); s.State != api.StateFailed {
			return fmt.Errorf("state %s", s.State)
		}
		return nil
	})
	checkConsistent(t) // no network or mitm record of the failed sandbox
	stack.MustNexus(t, "start", name)
	checkConsistent(t)
	give(t, name)
}

// A create refused at boot (an image the vmm does not have) leaves nothing: no record, no
// sandbox directory, no perimeter.
func TestRefusedCreateLeavesNothing(t *testing.T) {
	before, _ := filepath.Glob(filepath.Join(stack.Home.Sandboxes(), "sb-*"))
	_, errOut, code := stack.Nexus(t, "create", "crash/refused", "--image", "nexus-nope", "-l", "nexus-test=1")
	if code == 0 {
		t.Fatal("a create with an unknown image succeeded")
	}
	if s := find(t, "crash/refused"); s != nil {
		t.Fatalf("the refused create left a record: %s (%s)", s.State, errOut)
	}
	after, _ := filepath.Glob(filepath.Join(stack.Home.Sandboxes(), "sb-*"))
	if len(after) != len(before) {
		t.Fatalf("the refused create left a sandbox directory: %v (was %v)", after, before)
	}
	checkConsistent(t)
}

// The binary `make build` produces has no failpoints: neither the build tag nor the code
// that acts on them (whose marker the e2e build has).
func TestReleaseBuildHasNoFailpoints(t *testing.T) {
	const marker = "nexus-failpoints-armed" // pkg/failpoint.Marker, in the e2e build only
	plain, err := testutil.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	release := filepath.Join(plain, "nexus")
	for bin, want := range map[string]bool{release: false, stack.Bin: true} {
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(b, []byte(marker)); got != want {
			t.Errorf("%s: failpoint code present = %v, want %v", bin, got, want)
		}
		out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
		if err != nil {
			t.Fatalf("go version -m %s: %v: %s", bin, err, out)
		}
		if got := strings.Contains(string(out), "nexus_failpoints"); got != want {
			t.Errorf("%s: built with the tag nexus_failpoints = %v, want %v:\n%s", bin, got, want, out)
		}
	}
}
