// Package crash_test kills nexus with SIGKILL at every named step of the lifecycle operations
// (pkg/failpoint, armed in the e2e build only), restarts it, and checks the registry against
// what runs: no record mid-transition, a running sandbox answers exec with its configuration,
// nothing orphaned on disk, in /dev/shm, in the netstack or the mitm, and the user finishes the
// operation with one command. One stack (nexus-mini guests) serves the whole package.
package crash_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/failpoint"
)

var (
	stack *testutil.Stack
	// mountDir is live-mounted into every sandbox these tests create: a configured guest sees
	// its file at /work/mark.
	mountDir string
)

func TestMain(m *testing.M) {
	testutil.Main(m, &stack, testutil.Failpoints(), testutil.Setup(func(f *testutil.Fixture) error {
		mountDir = filepath.Join(f.Dir, "work")
		if err := os.MkdirAll(mountDir, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(mountDir, "mark"), []byte("mounted\n"), 0o644)
	}))
}

// createArgs creates a nexus-mini sandbox with a live mount, labelled for cleanup.
func createArgs(name string) []string {
	return []string{"create", name, "--image", "nexus-mini", "--memory", "256", "-l", "nexus-test=1", "--mount", mountDir + ":/work"}
}

// crashAt arms point, runs the CLI command args (which the crash cuts off), waits until the
// stack is dead and starts it again. The point must be reached.
func crashAt(t *testing.T, point string, args ...string) {
	t.Helper()
	if err := os.MkdirAll(stack.Home.Run(), 0o700); err != nil {
		t.Fatal(err)
	}
	armed := filepath.Join(stack.Home.Run(), failpoint.File)
	if err := os.WriteFile(armed, []byte(point+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	began := time.Now()
	cmd := exec.CommandContext(ctx, stack.Bin, args...)
	cmd.Env = stack.Env
	cliDone := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cliDone <- cmd.Wait() }()
	select {
	case <-stack.Exited():
	case err := <-cliDone:
		os.Remove(armed)
		t.Fatalf("failpoint %s was not reached: nexus %s ended (%v) and the stack runs on", point, strings.Join(args, " "), err)
	case <-time.After(3 * time.Minute):
		os.Remove(armed)
		t.Fatalf("failpoint %s was not reached within 3 minutes", point)
	}
	cancel() // the CLI lost its stack; it is not what is tested here
	<-cliDone
	killed := time.Now()
	if err := stack.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: killed after %v, up again in %v", point, killed.Sub(began).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
}

// sandboxes is `ps -a --json`.
func sandboxes(t *testing.T) []api.SandboxView {
	t.Helper()
	out := stack.MustNexus(t, "ps", "-a", "--json")
	var list []api.SandboxView
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v: %s", err, out)
	}
	return list
}

// find returns the record of name, or nil.
func find(t *testing.T, name string) *api.SandboxView {
	t.Helper()
	for _, s := range sandboxes(t) {
		if s.Name == name {
			return &s
		}
	}
	return nil
}

// checkConsistent checks the invariants of the whole stack: every record is settled and true
// to what runs, every running sandbox execs with its configuration, and nothing is left of a
// sandbox that has no record or no VM.
func checkConsistent(t *testing.T) {
	t.Helper()
	list := sandboxes(t)
	live := map[string]bool{} // ids whose VM must run
	known := map[string]bool{}
	for _, s := range list {
		known[s.ID] = true
		running := qemuCount(s.ID)
		switch s.State {
		case api.StateRunning, api.StatePaused:
			live[s.ID] = true
			if running != 1 {
				t.Errorf("%s is %s with %d QEMU processes", s.Name, s.State, running)
			}
		case api.StateStopped, api.StateFailed, api.StateCreated:
			if running != 0 {
				t.Errorf("%s is %s (%s) with %d QEMU processes", s.Name, s.State, s.Reason, running)
			}
			if s.State == api.StateFailed && s.Reason == "" {
				t.Errorf("%s is failed without a reason", s.Name)
			}
		default:
			t.Errorf("%s is left %s after the restart (%s)", s.Name, s.State, s.Reason)
		}
		if s.State == api.StateRunning {
			checkConfigured(t, s.Name)
		}
	}
	// Nothing on disk of a sandbox without a record; no perimeter and no RAM without a VM.
	dirs, _ := filepath.Glob(filepath.Join(stack.Home.Sandboxes(), "sb-*"))
	for _, d := range dirs {
		if !known[filepath.Base(d)] {
			t.Errorf("sandbox directory %s has no record", d)
		}
	}
	for _, store := range []string{stack.Home.Networks(), stack.Home.MITMSandboxes()} {
		ents, _ := os.ReadDir(store)
		for _, e := range ents {
			id, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok {
				t.Errorf("%s is left in %s", e.Name(), store)
				continue
			}
			if !live[id] {
				t.Errorf("%s holds a perimeter for %s, which has no running VM", store, id)
			}
		}
	}
	for id := range seenIDs {
		if live[id] {
			continue
		}
		if ram, _ := filepath.Glob("/dev/shm/nexus-" + id + "-*.ram"); len(ram) > 0 {
			t.Errorf("guest RAM %v is left of %s, which has no running VM", ram, id)
		}
		if n := qemuCount(id); n != 0 {
			t.Errorf("%d QEMU processes of %s, which has no running VM", n, id)
		}
	}
	for _, s := range list {
		seenIDs[s.ID] = true
	}
	if t.Failed() {
		t.FailNow()
	}
}

// seenIDs are the ids of every sandbox the tests have seen, to find what is left of them.
var seenIDs = map[string]bool{}

// remember records the ids of the sandboxes that exist now.
func remember(t *testing.T) {
	for _, s := range sandboxes(t) {
		seenIDs[s.ID] = true
	}
}

// checkConfigured runs a command in a running sandbox and checks what configure and mounts gave
// it: the perimeter's CA and the variable naming it, the hostname, the live mount.
func checkConfigured(t *testing.T, name string) {
	t.Helper()
	_, host, _ := strings.Cut(name, "/")
	script := fmt.Sprintf(`head -1 %[1]s; echo "$NODE_EXTRA_CA_CERTS"; hostname; cat /work/mark`, vmmapi.CAPath)
	want := fmt.Sprintf("-----BEGIN CERTIFICATE-----\n%s\n%s\nmounted\n", vmmapi.CAPath, host)
	out, errOut, code := stack.Nexus(t, "exec", name, "--", "sh", "-c", script)
	if code != 0 || out != want {
		t.Errorf("%s is running but not configured: exit %d\n%s%s\nwant:\n%s", name, code, out, errOut, want)
	}
}

// qemuCount is the number of QEMU processes of sandbox id.
func qemuCount(id string) int {
	out, _ := exec.Command("pgrep", "-f", filepath.Join(stack.Home.Sandbox(id), "qmp.sock")).Output()
	return len(strings.Fields(string(out)))
}

// rm removes a sandbox, forced, and checks it is gone.
func rm(t *testing.T, name string) {
	t.Helper()
	stack.MustNexus(t, "rm", "--force", name)
	if s := find(t, name); s != nil {
		t.Fatalf("%s is still there after rm: %s", name, s.State)
	}
}
