package vmm_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// create boots a nexus-mini sandbox labelled for cleanup and removes it when t ends.
func create(t *testing.T, name string, args ...string) {
	t.Helper()
	stack.MustNexus(t, append([]string{"create", name, "--image", "nexus-mini", "--memory", "256m", "-l", "nexus-test=1"}, args...)...)
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", name) })
}

func sandbox(t *testing.T, name string) api.SandboxView {
	t.Helper()
	out := stack.MustNexus(t, "ps", "-a", "--json")
	var list []api.SandboxView
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v: %s", err, out)
	}
	for _, s := range list {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no sandbox %s in ps -a", name)
	return api.SandboxView{}
}

func TestCreateRefusals(t *testing.T) {
	create(t, "refuse/one")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"create", "refuse/one", "--image", "nexus-mini"}, 1, "sandbox refuse/one already exists"},
		{[]string{"create", "Bad Name"}, 2, `invalid sandbox name "Bad Name"`},
		{[]string{"create", "refuse/low", "--image", "nexus-mini", "--memory", "64"}, 2, "below the guest's minimum of 128 MiB"},
		{[]string{"create", "refuse/img", "--image", "nexus-nope"}, 2, `unknown image "nexus-nope": known images are nexus-base, nexus-mini`},
		// Admission: more than the host can give is refused with the numbers, before a boot.
		{[]string{"create", "refuse/mem", "--image", "nexus-mini", "--memory", "200000"}, 1, "not enough host memory for a 200000 MiB sandbox: sandboxes may take"},
		{[]string{"create", "refuse/cpu", "--image", "nexus-mini", "--vcpus", "64"}, 1, "--vcpus 64 is more than this host's"},
	} {
		_, errOut, code := stack.Nexus(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("nexus %s: exit %d, stderr %q; want exit %d and one line containing %q", strings.Join(tc.args, " "), code, errOut, tc.code, tc.want)
		}
	}
	// A refused create leaves no record behind.
	out := stack.MustNexus(t, "ps", "-a")
	for _, n := range []string{"refuse/low", "refuse/img", "refuse/mem", "refuse/cpu"} {
		if strings.Contains(out, n) {
			t.Errorf("refused %s is in ps -a:\n%s", n, out)
		}
	}
}

func TestExec(t *testing.T) {
	create(t, "exec/box", "--label", "task-id=42")
	out, errOut, code := stack.Nexus(t, "exec", "exec/box", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	if out != "out\n" || errOut != "err\n" || code != 7 {
		t.Fatalf("got stdout %q stderr %q exit %d", out, errOut, code)
	}
	out, _, code = stack.NexusIn(t, []byte("piped input\n"), "exec", "-i", "exec/box", "--", "cat")
	if out != "piped input\n" || code != 0 {
		t.Fatalf("stdin: got %q exit %d", out, code)
	}
	out, _, _ = stack.Nexus(t, "exec", "-e", "GREETING=hi there", "-w", "/tmp", "exec/box", "--", "sh", "-c", `echo "$GREETING in $(pwd)"`)
	if out != "hi there in /tmp\n" {
		t.Fatalf("env and workdir: got %q", out)
	}
	_, errOut, code = stack.Nexus(t, "exec", "exec/box", "--", "no-such-binary")
	if code != 127 || !strings.Contains(errOut, `"no-such-binary": executable file not found`) {
		t.Fatalf("missing binary: exit %d, %q", code, errOut)
	}
	_, errOut, code = stack.Nexus(t, "exec", "--timeout", "1s", "exec/box", "--", "sleep", "30")
	if code != 124 || !strings.Contains(errOut, "timed out after 1s") {
		t.Fatalf("timeout: exit %d, %q", code, errOut)
	}
	// Output streams as it is produced and large output arrives whole.
	out, _, code = stack.Nexus(t, "exec", "exec/box", "--", "sh", "-c", "head -c 20000000 /dev/zero | tr '\\0' x")
	if code != 0 || len(out) != 20000000 || strings.Trim(out, "x") != "" {
		t.Fatalf("large output: exit %d, %d bytes", code, len(out))
	}
	// A background child outlives the exec that started it (a dev server, say).
	stack.MustNexus(t, "exec", "exec/box", "--", "sh", "-c", "sleep 600 >/dev/null 2>&1 &")
	if out, errOut, code := stack.Nexus(t, "exec", "exec/box", "--", "pidof", "sleep"); code != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("the background sleep died with its exec: %q %q", out, errOut)
	}
	// ps shows the columns and filters by label.
	ps := stack.MustNexus(t, "ps", "-l", "task-id=42")
	if !strings.Contains(ps, "NAME") || !strings.Contains(ps, "exec/box") || !strings.Contains(ps, "task-id=42") || !strings.Contains(ps, "claude-code") {
		t.Fatalf("ps -l task-id=42:\n%s", ps)
	}
	if ps := stack.MustNexus(t, "ps", "-l", "task-id=7"); strings.Contains(ps, "exec/box") {
		t.Fatalf("ps -l task-id=7 lists exec/box:\n%s", ps)
	}
	if vs := sandbox(t, "exec/box"); vs.State != api.StateRunning || vs.Image != "nexus-mini" || vs.MemoryMiB != 256 {
		t.Fatalf("ps --json: %+v", vs)
	}
}

func TestCopyAndLogs(t *testing.T) {
	create(t, "cp/box")
	src := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(src, []byte("to the guest\n"), 0o640)
	stack.MustNexus(t, "cp", src, "cp/box:/root/deep/in.txt")
	if out := stack.MustNexus(t, "exec", "cp/box", "--", "cat", "/root/deep/in.txt"); out != "to the guest\n" {
		t.Fatalf("guest sees %q", out)
	}
	stack.MustNexus(t, "exec", "cp/box", "--", "sh", "-c", "echo from the guest > /root/out.txt")
	dst := filepath.Join(t.TempDir(), "out.txt")
	stack.MustNexus(t, "cp", "cp/box:/root/out.txt", dst)
	if b, _ := os.ReadFile(dst); string(b) != "from the guest\n" {
		t.Fatalf("host got %q", b)
	}
	_, errOut, code := stack.Nexus(t, "cp", "cp/box:/nope", dst+".2")
	if code == 0 || !strings.Contains(errOut, "/nope") {
		t.Fatalf("copy of a missing file: exit %d %q", code, errOut)
	}
	if _, err := os.Stat(dst + ".2"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a failed copy left a file behind")
	}
	logs := stack.MustNexus(t, "logs", "cp/box")
	if !strings.Contains(logs, "kernel=6.") || !strings.Contains(logs, "nexus-agent") {
		t.Fatalf("logs lack the agent's boot lines:\n%.2000s", logs)
	}
}

func TestStopStartKeepsDiskAndRemoveLeavesNothing(t *testing.T) {
	create(t, "life/box")
	stack.MustNexus(t, "exec", "life/box", "--", "sh", "-c", "echo kept > /root/state && sync")
	stack.MustNexus(t, "stop", "life/box")
	if s := sandbox(t, "life/box"); s.State != api.StateStopped {
		t.Fatalf("after stop: %s", s.State)
	}
	if _, errOut, code := stack.Nexus(t, "exec", "life/box", "--", "true"); code == 0 || !strings.Contains(errOut, "not running") {
		t.Fatalf("exec on a stopped sandbox: exit %d %q", code, errOut)
	}
	stack.MustNexus(t, "start", "life/box")
	if out := stack.MustNexus(t, "exec", "life/box", "--", "cat", "/root/state"); out != "kept\n" {
		t.Fatalf("after stop/start the disk has %q", out)
	}
	stack.MustNexus(t, "pause", "life/box")
	if s := sandbox(t, "life/box"); s.State != api.StatePaused {
		t.Fatalf("after pause: %s", s.State)
	}
	stack.MustNexus(t, "resume", "life/box")
	stack.MustNexus(t, "exec", "life/box", "--", "true")

	s := sandbox(t, "life/box")
	dir := stack.Home.Sandbox(s.ID)
	pid := qemuPid(t, dir)
	if _, errOut, code := stack.Nexus(t, "rm", "life/box"); code == 0 || !strings.Contains(errOut, "rm --force") {
		t.Fatalf("rm of a running sandbox without --force: exit %d %q", code, errOut)
	}
	stack.MustNexus(t, "rm", "--force", "life/box")
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("rm left %s behind", dir)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("rm left QEMU %d running", pid)
	}
	if ram, _ := filepath.Glob("/dev/shm/nexus-" + s.ID + "*"); len(ram) > 0 {
		t.Fatalf("rm left the RAM file %v", ram)
	}
	if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "life/box") {
		t.Fatalf("rm left the record:\n%s", out)
	}
}

func qemuPid(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscanf(string(b), "%d", &pid)
	return pid
}

func TestMountIsSharedBothWays(t *testing.T) {
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "from-host"), []byte("h\n"), 0o644)
	create(t, "mount/box", "--mount", host+":/work", "--mount", host+":/ro:ro")
	if out := stack.MustNexus(t, "exec", "mount/box", "--", "cat", "/work/from-host"); out != "h\n" {
		t.Fatalf("guest reads %q", out)
	}
	stack.MustNexus(t, "exec", "mount/box", "--", "sh", "-c", "echo g > /work/from-guest")
	if b, _ := os.ReadFile(filepath.Join(host, "from-guest")); string(b) != "g\n" {
		t.Fatalf("host reads %q", b)
	}
	if _, _, code := stack.Nexus(t, "exec", "mount/box", "--", "sh", "-c", "echo x > /ro/nope"); code == 0 {
		t.Fatal("a write to a read-only mount succeeded")
	}
}

func TestVsockListenerInGuest(t *testing.T) {
	create(t, "vsock/box")
	out, errOut, code := stack.Nexus(t, "exec", "vsock/box", "--", "/run/nexus/bin/nexus-agent", "selftest-vsock")
	if code != 0 {
		t.Fatalf("selftest-vsock: exit %d\n%s%s", code, out, errOut)
	}
}

func TestTTY(t *testing.T) {
	create(t, "tty/box")
	out, _, code := stack.Nexus(t, "exec", "-t", "tty/box", "--", "sh", "-c", "tty; stty size")
	lines := strings.Fields(out)
	if code != 0 || len(lines) < 3 || !strings.HasPrefix(lines[0], "/dev/pts/") {
		t.Fatalf("exec -t: exit %d %q", code, out)
	}
}

// A guest that panics is noticed and its sandbox becomes failed with a reason.
func TestGuestPanicIsDetected(t *testing.T) {
	create(t, "panic/box")
	stack.Nexus(t, "exec", "--timeout", "5s", "panic/box", "--", "sh", "-c", "echo c > /proc/sysrq-trigger")
	testutil.WaitFor(t, 60*time.Second, func() error {
		if s := sandbox(t, "panic/box"); s.State != api.StateFailed || s.Reason == "" {
			return fmt.Errorf("state %s (%q)", s.State, s.Reason)
		}
		return nil
	})
}

// Killing the whole stack with SIGKILL leaves the VMs running; the restarted vmm adopts them.
func TestKilledStackReadoptsVMs(t *testing.T) {
	create(t, "adopt/box")
	stack.MustNexus(t, "exec", "adopt/box", "--", "sh", "-c", "echo before > /tmp/mark")
	s := sandbox(t, "adopt/box")
	pid := qemuPid(t, stack.Home.Sandbox(s.ID))
	stack.Kill()
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("QEMU died with the stack")
	}
	if err := stack.Restart(); err != nil {
		t.Fatal(err)
	}
	if out := stack.MustNexus(t, "exec", "adopt/box", "--", "cat", "/tmp/mark"); out != "before\n" {
		t.Fatalf("after restart the guest has %q", out)
	}
	if s := sandbox(t, "adopt/box"); s.State != api.StateRunning {
		t.Fatalf("after restart: %s %q", s.State, s.Reason)
	}
	// Exactly one QEMU for that sandbox.
	out, _ := exec.Command("pgrep", "-f", stack.Home.Sandbox(s.ID)+"/qmp.sock").Output()
	if n := len(strings.Fields(string(out))); n != 1 {
		t.Fatalf("%d QEMU processes for the sandbox", n)
	}
}

// A sandbox with --ttl is removed when it expires, VM and all, by the stack that runs then
// (here one restarted after a kill): the expiry is in the registry, not in a process's memory.
func TestTTLRemovesTheSandboxAcrossARestart(t *testing.T) {
	// The ttl counts from the create, so it must outlast a cold boot on a loaded 2-core host
	// (one took 39 s there with ten other guests booting).
	create(t, "ttl/box", "--ttl", "60s")
	s := sandbox(t, "ttl/box")
	if s.ExpiresAt.IsZero() || s.ExpiresAt.Sub(s.CreatedAt) < 59*time.Second || s.ExpiresAt.Sub(s.CreatedAt) > 61*time.Second {
		t.Fatalf("ps --json: expires_at %v for a 60s ttl created at %v", s.ExpiresAt, s.CreatedAt)
	}
	if out := stack.MustNexus(t, "ps"); !strings.Contains(out, "(ttl ") {
		t.Errorf("ps does not show the ttl:\n%s", out)
	}
	pid := qemuPid(t, stack.Home.Sandbox(s.ID))
	stack.Kill()
	if err := stack.Restart(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 3*time.Minute, func() error {
		if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "ttl/box") {
			return errors.New("ttl/box is still listed")
		}
		return nil
	})
	testutil.WaitFor(t, 30*time.Second, func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("QEMU %d still runs", pid)
		}
		return nil
	})
}

// nexus stats reports figures that move: CPU while the guest burns it, disk as it writes.
func TestStatsMoveWithTheGuest(t *testing.T) {
	create(t, "stats/box")
	sample := func() api.SandboxStats {
		t.Helper()
		out := stack.MustNexus(t, "stats", "stats/box", "--json")
		var list []api.SandboxStats
		if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 {
			t.Fatalf("stats --json: %v: %s", err, out)
		}
		return list[0]
	}
	idle := sample()
	if idle.MemoryMiB != 256 || idle.RSSBytes <= 0 || idle.DiskSizeBytes <= 0 || idle.DiskUsedBytes <= 0 {
		t.Fatalf("idle sample: %+v", idle)
	}
	// A guest writing 32 MiB to its root disk.
	stack.MustNexus(t, "exec", "stats/box", "--", "sh", "-c", "dd if=/dev/urandom of=/stats.bin bs=1M count=32 2>/dev/null && sync")
	if wrote := sample(); wrote.DiskUsedBytes < idle.DiskUsedBytes+16<<20 {
		t.Errorf("disk used %d after writing 32 MiB, %d before", wrote.DiskUsedBytes, idle.DiskUsedBytes)
	}
	// A guest burning a core while a sample is taken.
	// The burner runs until the figure moved (a lost exec stream kills it in the guest), so a
	// loaded host that gives the guest little CPU only makes the wait longer.
	burn := stack.Command("exec", "stats/box", "--", "sh", "-c", "end=$(($(date +%s)+60)); while [ $(date +%s) -lt $end ]; do :; done")
	if err := burn.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { burn.Process.Kill(); burn.Wait() }()
	testutil.WaitFor(t, 60*time.Second, func() error {
		if busy := sample(); busy.CPUPercent < 25 || busy.CPUPercent < 2*idle.CPUPercent {
			return fmt.Errorf("CPU %.1f%% while the guest burns a core, %.1f%% idle", busy.CPUPercent, idle.CPUPercent)
		}
		return nil
	})
	if out := stack.MustNexus(t, "stats"); !strings.Contains(out, "stats/box") || !strings.Contains(out, "CPU%") {
		t.Errorf("stats table:\n%s", out)
	}
}

// A sandbox with --idle-timeout that nothing uses is paused (its guest idle under TCG too), and
// the next exec resumes it and runs.
func TestIdleTimeoutPausesAndExecResumes(t *testing.T) {
	create(t, "idle/box", "--idle-timeout", "15s")
	testutil.WaitFor(t, 3*time.Minute, func() error {
		if s := sandbox(t, "idle/box"); s.State != api.StatePaused {
			st := stack.MustNexus(t, "stats", "idle/box")
			return fmt.Errorf("%s %q; stats:\n%s", s.State, s.Reason, st)
		}
		return nil
	})
	if s := sandbox(t, "idle/box"); !strings.Contains(s.Reason, "no activity for 15s") {
		t.Errorf("paused with reason %q", s.Reason)
	}
	if out := stack.MustNexus(t, "exec", "idle/box", "--", "echo", "awake"); out != "awake\n" {
		t.Fatalf("exec after an idle pause: %q", out)
	}
	if s := sandbox(t, "idle/box"); s.State != api.StateRunning {
		t.Fatalf("after the exec: %s %q", s.State, s.Reason)
	}
}
