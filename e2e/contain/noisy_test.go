package contain_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpuSeconds is the CPU time (user and system, all threads) process pid has used.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// noise starts script in the background inside a sandbox, in a session of its own so the exec
// that starts it returns at once.
func noise(t *testing.T, name, script string) {
	t.Helper()
	stack.MustNexus(t, "exec", name, "--", "sh", "-c", "setsid sh -c '"+script+"' </dev/null >/dev/null 2>&1 &")
}

// quietWhile runs execs in the quiet sandbox for at least d and returns how long it took; each
// must answer.
func quietWhile(t *testing.T, name string, d time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	n := 0
	for n < 3 || time.Since(t0) < d {
		execOK(t, name)
		n++
	}
	return time.Since(t0)
}

// TestNoisyNeighbours: beside a sandbox that burns its CPU, fills its disk and fork-bombs (the
// loads added one after another and left running), a quiet sandbox's exec keeps answering, and
// the noisy one stays inside its limits as the host sees them: the CPU quota of --cpus, its
// memory and pids limits, its own cgroup's disk I/O.
func TestNoisyNeighbours(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cgroup.procs"); err != nil {
		t.Skip("no cgroup v1 cpu controller here")
	}
	create(t, "noisy/quiet")
	create(t, "noisy/loud", "--cpus", "0.5")
	pid := qemuPid(t, "noisy/loud")
	execOK(t, "noisy/quiet")

	t.Run("cpu", func(t *testing.T) {
		cpu := cgroupDir(t, pid, "cpu")
		noise(t, "noisy/loud", "while :; do :; done")
		c0, t0, thr0 := cpuSeconds(t, pid), time.Now(), cpuStat(t, cpu)["nr_throttled"]
		quietWhile(t, "noisy/quiet", 6*time.Second)
		used := (cpuSeconds(t, pid) - c0) / time.Since(t0).Seconds()
		thr := cpuStat(t, cpu)["nr_throttled"] - thr0
		t.Logf("the burner's QEMU used %.2f CPUs (--cpus 0.5), throttled in %d periods", used, thr)
		// At most its quota, with room for the accounting's granularity; one that came near it
		// was throttled (on a busy host it may get less than its quota and never be).
		if thr == 0 && used > 0.4 {
			t.Errorf("the burner's QEMU used %.2f CPUs and was never throttled", used)
		}
		if used > 0.6 {
			t.Fatalf("the burner's QEMU used %.2f CPUs, more than its --cpus 0.5", used)
		}
	})

	t.Run("disk", func(t *testing.T) {
		// 96 MiB of data that is not zeroes (detect-zeroes would not store it), synced: the home
		// is a 1 GiB ext4, so this leaves it above the watermark.
		blkio := cgroupDir(t, pid, "blkio")
		before := ioBytes(t, blkio)
		noise(t, "noisy/loud", "tr \"\\000\" x </dev/zero | dd of=/fill bs=1M count=96 conv=fsync; sync; touch /fill.done")
		deadline := time.Now().Add(3 * time.Minute)
		for {
			quietWhile(t, "noisy/quiet", 0)
			out, _, code := stack.Nexus(t, "exec", "noisy/loud", "--", "test", "-e", "/fill.done")
			if code == 0 {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("the filler did not finish in 3 minutes: %d %s", code, out)
			}
		}
		// The quiet one's own disk writes still go through.
		out, errOut, code := stack.Nexus(t, "exec", "noisy/quiet", "--", "sh", "-c", "echo written >/q && sync && cat /q")
		if code != 0 || out != "written\n" {
			t.Fatalf("the quiet sandbox's disk: exit %d %q %q", code, out, errOut)
		}
		t.Logf("the filler's cgroup: %d MiB of disk I/O", (ioBytes(t, blkio)-before)>>20)
	})

	t.Run("forkbomb", func(t *testing.T) {
		// The burner goes (kill -1 spares the agent, PID 1), so the bomb has the guest's CPU.
		stack.Nexus(t, "exec", "noisy/loud", "--", "sh", "-c", "kill -9 -1")
		noise(t, "noisy/loud", "b() { b | b & }; b")
		pids := cgroupDir(t, pid, "pids")
		mem := cgroupDir(t, pid, "memory")
		quietWhile(t, "noisy/quiet", 10*time.Second)
		// The guest's commands run in a cgroup of their own, so the bomb leaves its agent
		// answering; before, it took the agent down within seconds and the sandbox failed as
		// "hung or panicked".
		out, errOut, code := stack.Nexus(t, "exec", "noisy/loud", "--", "echo", "alive")
		if code != 0 || out != "alive\n" || state(t, "noisy/loud") != "running" {
			t.Errorf("the fork-bombing sandbox does not answer: exit %d %q %q; %s %s", code, out, errOut, state(t, "noisy/loud"), reason(t, "noisy/loud"))
		}
		// The guest's processes are not the host's: QEMU's stay few and inside its pids limit.
		cur, _ := strconv.Atoi(readTrim(t, filepath.Join(pids, "pids.current")))
		limit, _ := strconv.Atoi(readTrim(t, filepath.Join(pids, "pids.max")))
		if cur == 0 || cur > limit || cur > 64 {
			t.Errorf("the fork bomb's QEMU cgroup holds %d tasks (limit %d)", cur, limit)
		}
		peak, _ := strconv.ParseInt(readTrim(t, filepath.Join(mem, "memory.max_usage_in_bytes")), 10, 64)
		lim, _ := strconv.ParseInt(readTrim(t, filepath.Join(mem, "memory.limit_in_bytes")), 10, 64)
		if peak > lim {
			t.Errorf("the fork bomb's QEMU peaked at %d MiB, over its limit of %d MiB", peak>>20, lim>>20)
		}
		t.Logf("fork bomb: QEMU has %d tasks (limit %d), peak memory %d of %d MiB; the loud sandbox is %s %s",
			cur, limit, peak>>20, lim>>20, state(t, "noisy/loud"), reason(t, "noisy/loud"))
	})
	execOK(t, "noisy/quiet")
}

// ioBytes is the bytes of disk I/O the v1 blkio cgroup dir accounted, all devices.
func ioBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	for _, l := range strings.Split(readTrim(t, filepath.Join(dir, "blkio.throttle.io_service_bytes")), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[1] == "Total" {
			v, _ := strconv.ParseInt(f[2], 10, 64)
			n += v
		}
	}
	return n
}

// cpuStat is a v1 cpu cgroup's cpu.stat.
func cpuStat(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, l := range strings.Split(readTrim(t, filepath.Join(dir, "cpu.stat")), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			out[k], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return out
}
