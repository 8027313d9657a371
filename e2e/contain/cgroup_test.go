package contain_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

// qemuPid is the QEMU of a running sandbox, from its pidfile.
func qemuPid(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stack.Home.Sandbox(sandboxID(t, name)), "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func sandboxID(t *testing.T, name string) string {
	t.Helper()
	out := stack.MustNexus(t, "ps", "-a", "--json")
	var list []struct {
		ID     string `json:"id"`
		Name   string `json:"name"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v: %s", err, out)
	}
	for _, s := range list {
		if s.Name == name {
			return s.ID
		}
	}
	t.Fatalf("no sandbox %s", name)
	return ""
}

// cgroupDir is the directory of controller (a v1 hierarchy name, or "" for v2) pid is in.
func cgroupDir(t *testing.T, pid int, controller string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return filepath.Join("/sys/fs/cgroup", controller, parts[2])
			}
		}
	}
	t.Fatalf("pid %d is in no %s cgroup:\n%s", pid, controller, b)
	return ""
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestCgroupLimits: each QEMU is in a cgroup of its own holding only it, with the memory limit
// (guest RAM plus QEMU's overhead), the CPU quota of --cpus, a pids limit; the cgroup goes
// when the sandbox is removed. This host has v1 controllers (an empty v2 hierarchy).
func TestCgroupLimits(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err != nil {
		t.Skip("no cgroup v1 memory controller here")
	}
	create(t, "cg/half", "--cpus", "0.5")
	pid := qemuPid(t, "cg/half")
	mem := cgroupDir(t, pid, "memory")
	if !strings.Contains(mem, "/nexus-vm-"+sandboxID(t, "cg/half")+"-") {
		t.Fatalf("qemu %d is in memory cgroup %s, not one of its own", pid, mem)
	}
	if procs := readTrim(t, filepath.Join(mem, "cgroup.procs")); procs != strconv.Itoa(pid) {
		t.Fatalf("cgroup %s holds %q, want only qemu %d", mem, procs, pid)
	}
	if lim := readTrim(t, filepath.Join(mem, "memory.limit_in_bytes")); lim != strconv.Itoa((256+224)<<20) {
		t.Errorf("memory limit %s, want 256 MiB guest + 224 MiB TCG overhead", lim)
	}
	cpu := cgroupDir(t, pid, "cpu")
	if q := readTrim(t, filepath.Join(cpu, "cpu.cfs_quota_us")); q != "50000" {
		t.Errorf("cpu quota %s µs per 100ms, want 50000 for --cpus 0.5", q)
	}
	if p := readTrim(t, filepath.Join(cgroupDir(t, pid, "pids"), "pids.max")); p != "512" {
		t.Errorf("pids.max %s", p)
	}
	// What QEMU used after boot and an exec: the measured overhead behind the limit.
	execOK(t, "cg/half")
	peak, _ := strconv.ParseInt(readTrim(t, filepath.Join(mem, "memory.max_usage_in_bytes")), 10, 64)
	t.Logf("qemu cgroup peak memory after boot and exec: %d MiB (256 MiB guest)", peak>>20)

	stack.MustNexus(t, "rm", "--force", "cg/half")
	if _, err := os.Stat(mem); !os.IsNotExist(err) {
		t.Fatalf("cgroup %s is left after rm: %v", mem, err)
	}
}

// TestOOMReported: a QEMU the kernel kills for its cgroup's memory limit is reported as out of
// memory with the limit, never as a hang or an unexplained exit. The test lowers the limit of a
// running sandbox and has the guest fill its RAM.
func TestOOMReported(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err != nil {
		t.Skip("no cgroup v1 memory controller here")
	}
	create(t, "cg/oom")
	pid := qemuPid(t, "cg/oom")
	mem := cgroupDir(t, pid, "memory")
	used, _ := strconv.ParseInt(readTrim(t, filepath.Join(mem, "memory.usage_in_bytes")), 10, 64)
	limit := used + 48<<20
	for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		os.WriteFile(filepath.Join(mem, f), []byte(strconv.FormatInt(limit, 10)), 0)
	}
	stack.Nexus(t, "exec", "cg/oom", "--", "sh", "-c",
		"mkdir -p /mnt/ram && mount -t tmpfs -o size=200m ram /mnt/ram && tr '\\000' x </dev/zero | dd of=/mnt/ram/fill bs=1M count=190 iflag=fullblock")
	want := fmt.Sprintf("out of memory (limit %d MiB)", limit>>20)
	testutil.WaitFor(t, 60*time.Second, func() error {
		if st := state(t, "cg/oom"); st != "failed" {
			return fmt.Errorf("state %s", st)
		}
		return nil
	})
	if r := reason(t, "cg/oom"); !strings.Contains(r, want) || strings.Contains(r, "hung") {
		t.Fatalf("failed with %q, want %q", r, want)
	}
}

func reason(t *testing.T, name string) string {
	t.Helper()
	out := stack.MustNexus(t, "ps", "-a", "--json")
	var list []struct {
		Name   string `json:"name"`
		Reason string `json:"reason"`
	}
	json.Unmarshal([]byte(out), &list)
	for _, s := range list {
		if s.Name == name {
			return s.Reason
		}
	}
	return ""
}
