// Package crash_test kills nexus with SIGKILL at every named step of the lifecycle operations
// (pkg/failpoint, armed in the e2e build only), restarts it, and checks the registry against
// what runs: no record mid-transition, a running sandbox answers exec with its configuration,
// nothing orphaned on disk, in /dev/shm, in the netstack or the mitm, and the user finishes the
// operation with one command. One stack (nexus-mini guests) serves the whole package; its
// $NEXUS_HOME is a loop-mounted ext4, so that a guest can fill "the host disk" for real.
package crash_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/failpoint"
	"github.com/IniZio/nexus/pkg/home"
)

// The stack's home: an ext4 of homeSize (a sparse file: only what is written takes space, and
// creates ask for the default 8 GiB root disk's room), with the disk watermark at minFree.
const (
	homeSize = "24G"
	minFree  = "64MiB"
)

var (
	stack   *testutil.Stack
	tmpHome string
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
		if err := os.WriteFile(filepath.Join(mountDir, "mark"), []byte("mounted\n"), 0o644); err != nil {
			return err
		}
		if os.Geteuid() != 0 {
			return fmt.Errorf("the crash tests mount a loop device as the home: run them as root")
		}
		// A loop-mounted ext4, as in e2e/contain (a tmpfs would fill the writer's memory
		// cgroup before it fills).
		tmpHome = filepath.Join(f.Dir, "home")
		img := filepath.Join(f.Dir, "home.img")
		if err := os.MkdirAll(tmpHome, 0o700); err != nil {
			return err
		}
		for _, c := range [][]string{{"truncate", "-s", homeSize, img}, {"mkfs.ext4", "-q", "-m", "0", "-N", "65536", "-E", "lazy_itable_init=1,lazy_journal_init=1", img},
			{"mount", "-o", "loop", img, tmpHome}, {"chmod", "0700", tmpHome}} {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %v: %s", c[0], err, out)
			}
		}
		f.Cleanup(func() { exec.Command("umount", "-l", tmpHome).Run() })
		f.Env("NEXUS_HOME="+tmpHome, "NEXUS_MIN_FREE_DISK="+minFree)
		return nil
	}), testutil.Started(func(s *testutil.Stack) error {
		s.Home = home.Dir(tmpHome) // the environment's NEXUS_HOME wins over the stack's own
		return nil
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
	select {
	case <-stack.Exited():
		// Whatever ended it is a failure of its own (logged with the case that saw it); a kill
		// that found no stack to kill would test nothing, and its case would fail for the wrong
		// reason.
		if err := stack.Restart(); err != nil {
			t.Fatal(err)
		}
		t.Fatalf("the stack had exited before %s was armed", point)
	default:
	}
	logFrom := len(stack.Log())
	t.Cleanup(func() {
		if t.Failed() { // what the stack said during this case, to tell why
			log := stack.Log()[logFrom:]
			if len(log) > 30000 {
				log = log[len(log)-30000:]
			}
			t.Logf("nexus up said during this case:\n%s", log)
		}
	})
	startWitness(t)
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
	checkAuditKept(t)
}

// witness is a sandbox whose guest asks the gateway's resolver, twice a second, for a name off
// its allowlist (a denial the netstack audits) and notes each name it got the refusal for in
// /root/denied: decisions made, and seen by the guest, before whatever kill comes next. Each
// noted name must be in the audit stream after the restart (the spooled publisher's promise).
const witness = "crash/witness"

var witnessOnce sync.Once

const witnessLoop = `setsid sh -c 'i=0; while :; do i=$((i+1)); n=w$i.lost.example; nslookup $n 2>&1 | grep -q NXDOMAIN && echo $n >> /root/denied; sleep 0.5; done' </dev/null >/dev/null 2>&1 &`

func startWitness(t *testing.T) {
	t.Helper()
	witnessOnce.Do(func() {
		stack.MustNexus(t, createArgs(witness)...)
		stack.MustNexus(t, "exec", witness, "--", "sh", "-c", witnessLoop)
		remember(t)
	})
}

// checkAuditKept checks that every denial the witness's guest saw is in the audit stream.
func checkAuditKept(t *testing.T) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, func() error {
		out, errOut, code := stack.Nexus(t, "exec", witness, "--", "cat", "/root/denied")
		if code != 0 {
			return fmt.Errorf("the witness's denials: exit %d: %s", code, errOut)
		}
		seen := strings.Fields(out)
		if len(seen) == 0 {
			return errors.New("the witness's guest saw no denial yet")
		}
		stream, errOut, code := stack.Nexus(t, "audit", "tail", "--sandbox", witness, "--denied", "--json")
		if code != 0 {
			return fmt.Errorf("audit tail: exit %d: %s", code, errOut)
		}
		audited := map[string]bool{}
		for _, line := range strings.Split(stream, "\n") {
			var ev audit.Event
			if json.Unmarshal([]byte(line), &ev) == nil && ev.Layer == audit.LayerDNS {
				audited[ev.Host] = true
			}
		}
		var lost []string
		for _, n := range seen {
			if !audited[n] {
				lost = append(lost, n)
			}
		}
		if len(lost) > 0 {
			return fmt.Errorf("%d of the %d denials the guest saw are not in the audit stream: %v", len(lost), len(seen), lost)
		}
		return nil
	})
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
	}
	// The running sandboxes exec at once (each exec waits mostly on its guest).
	var wg sync.WaitGroup
	for _, s := range list {
		if s.State == api.StateRunning {
			wg.Add(1)
			go func() {
				defer wg.Done()
				checkConfigured(t, s.Name, len(s.Mounts) > 0)
			}()
		}
	}
	wg.Wait()
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
// it: the perimeter's CA and the variable naming it, the hostname, the live mount (when mounted:
// a sandbox to snapshot has none).
func checkConfigured(t *testing.T, name string, mounted bool) {
	t.Helper()
	_, host, _ := strings.Cut(name, "/")
	script := fmt.Sprintf(`head -1 %[1]s; echo "$NODE_EXTRA_CA_CERTS"; hostname`, vmmapi.CAPath)
	want := fmt.Sprintf("-----BEGIN CERTIFICATE-----\n%s\n%s\n", vmmapi.CAPath, host)
	if mounted {
		script += "; cat /work/mark"
		want += "mounted\n"
	}
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
