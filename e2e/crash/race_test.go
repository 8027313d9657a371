package crash_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// outcome is how one CLI command of a race ended.
type outcome struct {
	args   []string
	code   int
	stderr string
}

func (o outcome) String() string {
	return fmt.Sprintf("nexus %s: exit %d %s", strings.Join(o.args, " "), o.code, strings.TrimSpace(o.stderr))
}

// race runs the commands at once and returns how each ended.
func race(t *testing.T, cmds ...[]string) []outcome {
	t.Helper()
	out := make([]outcome, len(cmds))
	var wg sync.WaitGroup
	for i, args := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errOut, code := stack.Nexus(t, args...)
			out[i] = outcome{args: args, code: code, stderr: errOut}
		}()
	}
	wg.Wait()
	return out
}

// Operations racing on one sandbox: each that loses is refused with a sentence saying why (or
// waits for the other and succeeds), and afterwards the registry is true and nothing leaks.
func TestRacingOperations(t *testing.T) {
	name := snapshotParent(t)

	t.Run("stop during snapshot", func(t *testing.T) {
		const snap = "crash-race"
		t.Cleanup(func() { stack.Nexus(t, "snapshot", "rm", snap) })
		res := race(t, []string{"snapshot", "create", name, snap}, []string{"stop", name})
		for _, o := range res {
			t.Log(o)
		}
		if res[1].code != 0 {
			t.Errorf("the stop failed: %v", res[1])
		}
		if o := res[0]; o.code != 0 && !strings.Contains(o.stderr, "only a running or paused sandbox can be snapshotted") {
			t.Errorf("the snapshot that lost the race does not say why: %v", o)
		}
		if s := find(t, name); s == nil || s.State != api.StateStopped {
			t.Fatalf("after stop and snapshot raced: %+v", s)
		}
		checkConsistent(t)
		checkSnapshots(t)
		if res[0].code == 0 {
			checkFork := "crash/race-fork"
			stack.MustNexus(t, "fork", snap, checkFork)
			if out := stack.MustNexus(t, "exec", checkFork, "--", "cat", "/root/mark"); out != "parent\n" {
				t.Errorf("the fork of the snapshot that raced a stop has %q", out)
			}
			rm(t, checkFork)
		}
	})

	t.Run("two starts", func(t *testing.T) {
		res := race(t, []string{"start", name}, []string{"start", name})
		won := 0
		for _, o := range res {
			t.Log(o)
			switch {
			case o.code == 0:
				won++
			case !strings.Contains(o.stderr, "sandbox "+name+" is already starting: another start is under way"):
				t.Errorf("the start that lost the race does not say why: %v", o)
			}
		}
		if won == 0 {
			t.Errorf("neither start succeeded")
		}
		if s := find(t, name); s == nil || s.State != api.StateRunning {
			t.Fatalf("after two starts: %+v", s)
		}
		checkConsistent(t)
	})

	t.Run("rm during create", func(t *testing.T) {
		victim := "crash/race-rm"
		created := make(chan outcome, 1)
		go func() {
			args := []string{"create", victim, "--image", "nexus-mini", "--memory", "256", "-l", "nexus-test=1"}
			_, errOut, code := stack.Nexus(t, args...)
			created <- outcome{args: args, code: code, stderr: errOut}
		}()
		testutil.WaitFor(t, time.Minute, func() error {
			if s := find(t, victim); s == nil || s.State != api.StateStarting {
				return fmt.Errorf("not starting yet: %+v", s)
			}
			return nil
		})
		remember(t)
		stack.MustNexus(t, "rm", "--force", victim)
		o := <-created
		t.Log(o)
		if o.code != 0 && !strings.Contains(o.stderr, "sandbox "+victim+" was removed while it was starting") {
			t.Errorf("the create that rm cut off does not say why: %v", o)
		}
		if s := find(t, victim); s != nil {
			t.Fatalf("%s is still there after rm during its create: %+v", victim, s)
		}
		checkConsistent(t)
	})
}
