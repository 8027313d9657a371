package crash_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// The named steps of a boot, as the gateway and the vmm hit them. kernel and initramfs run on
// the first boot of a vmm only (later boots skip them).
var (
	firstBootSteps = []string{"vmm/start/kernel", "vmm/start/initramfs"}
	bootSteps      = []string{"gateway/boot/starting", "gateway/boot/perimeter",
		"vmm/start/image", "vmm/start/disk", "vmm/start/qemu", "vmm/start/agent", "vmm/start/configure", "vmm/start/mounts",
		"vmm/start/booted", "gateway/boot/vm"}
)

// caseName turns a point into a sandbox name.
func caseName(prefix, point string) string {
	return "crash/" + prefix + "-" + strings.NewReplacer("/", "-").Replace(strings.TrimPrefix(strings.TrimPrefix(point, "gateway/"), "vmm/"))
}

// createAll creates the sandboxes names at once, and removes them when t ends.
func createAll(t *testing.T, names ...string) {
	t.Helper()
	t.Cleanup(func() { stack.Nexus(t, append([]string{"rm", "--force"}, names...)...) })
	createEach(t, names...)
}

// createEach creates the sandboxes names at once.
func createEach(t *testing.T, names ...string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]string, len(names))
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, errOut, code := stack.Nexus(t, createArgs(n)...); code != 0 {
				errs[i] = fmt.Sprintf("create %s: exit %d: %s%s", n, code, out, errOut)
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			t.Fatal(e)
		}
	}
	remember(t)
}

// finishStart is the one command that completes interrupted creates and starts: `nexus start`
// of them all (a create cut off before its record is made again). Each is running after it,
// configured.
func finishStart(t *testing.T, names ...string) {
	t.Helper()
	var start []string
	for _, name := range names {
		switch s := find(t, name); {
		case s == nil:
			stack.MustNexus(t, createArgs(name)...)
		case s.State != api.StateRunning:
			start = append(start, name)
		}
	}
	// One command per sandbox finishes its start; a few per `nexus start` keep a loaded
	// 2-core host from booting a dozen guests at once.
	for batch := range slices.Chunk(start, 3) {
		stack.MustNexus(t, append([]string{"start"}, batch...)...)
	}
	for _, name := range names {
		if s := find(t, name); s == nil || s.State != api.StateRunning {
			t.Errorf("%s is not running after the one command that finishes its start: %+v", name, s)
		}
	}
	checkConsistent(t)
}

// A create killed at any step ends, after the restart, as a sandbox that is running and
// configured, or created or failed (with the reason) with nothing of it running; one
// `nexus start` then finishes them all.
func TestCrashDuringCreate(t *testing.T) {
	points := append([]string{"gateway/create/recorded"}, firstBootSteps...)
	points = append(points, bootSteps...)
	var names, finish []string
	t.Cleanup(func() {
		if t.Failed() { // else they were handed on
			stack.Nexus(t, append([]string{"rm", "--force"}, names...)...)
		}
	})
	for _, point := range points {
		name := caseName("create", point)
		t.Run(point, func(t *testing.T) {
			names = append(names, name)
			if slices.Contains(firstBootSteps, point) {
				// A vmm that has not booted anything yet.
				stack.Kill()
				if err := stack.Restart(); err != nil {
					t.Fatal(err)
				}
			}
			crashAt(t, point, createArgs(name)...)
			checkConsistent(t)
			// One that runs was just checked configured; it waits paused (idle guests take
			// CPU from the boots of the points after it) and goes through their restarts so.
			if s := find(t, name); s != nil && s.State == api.StateRunning {
				idle(t, name)
			} else {
				finish = append(finish, name)
			}
		})
	}
	for batch := range slices.Chunk(finish, 3) {
		finishStart(t, batch...)
		idle(t, batch...)
	}
	give(t, names...)
	checkConsistent(t)
}

// A stop killed at any step is finished by the restarted stack: the sandbox is stopped, its
// perimeter released. Each point stops a sandbox of its own, which TestCrashDuringStart then
// starts again (nothing of its perimeter is left in the way).
func TestCrashDuringStop(t *testing.T) {
	points := []string{"gateway/stop/stopping", "gateway/stop/vm", "gateway/stop/perimeter"}
	names := take(t, len(points))
	for i, point := range points {
		t.Run(point, func(t *testing.T) {
			crashAt(t, point, "stop", names[i])
			checkConsistent(t)
			if s := find(t, names[i]); s == nil || s.State != api.StateStopped {
				t.Fatalf("after a crash during stop: %+v", s)
			}
			stack.MustNexus(t, "stop", names[i]) // the one command: already done
		})
	}
	giveStopped(t, names...)
}

// A start of a stopped sandbox killed at a step of its boot: the same promise as create.
func TestCrashDuringStart(t *testing.T) {
	points := []string{"gateway/boot/starting", "vmm/start/qemu", "vmm/start/configure", "gateway/boot/vm"}
	names := takeStopped(t, len(points))
	for i, point := range points {
		t.Run(point, func(t *testing.T) {
			crashAt(t, point, "start", names[i])
			checkConsistent(t)
		})
	}
	finishStart(t, names...)
	give(t, names...)
}

// A remove killed at any step is finished by the restarted stack: nothing of the sandbox is
// left, and the name is free again.
func TestCrashDuringRemove(t *testing.T) {
	points := []string{"gateway/remove/removing", "gateway/remove/vm", "gateway/remove/perimeter"}
	names := take(t, len(points))
	for i, point := range points {
		t.Run(point, func(t *testing.T) {
			crashAt(t, point, "rm", "--force", names[i])
			checkConsistent(t)
			if s := find(t, names[i]); s != nil {
				t.Fatalf("%s is still there (%s) after a crash during its removal", names[i], s.State)
			}
		})
	}
}

// A pause or resume killed between the VM and the record: the restarted stack makes the record
// and the VM agree, and the sandbox execs.
func TestCrashDuringPauseAndResume(t *testing.T) {
	name := take(t, 1)[0]
	crashAt(t, "gateway/pause/vm", "pause", name)
	checkConsistent(t)
	if s := find(t, name); s == nil || s.State != api.StateRunning {
		t.Fatalf("after a crash during pause: %+v", s)
	}
	stack.MustNexus(t, "pause", name)
	crashAt(t, "gateway/resume/vm", "resume", name)
	checkConsistent(t)
	if s := find(t, name); s == nil || s.State != api.StateRunning {
		t.Fatalf("after a crash during resume: %+v", s)
	}
	give(t, name)
}
