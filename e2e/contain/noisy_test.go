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
// the noisy one stays inside its limits as the host sees them: the CPU quota of --cpus, the disk
// write rate of --disk-bps, its memory and pids limits.
func TestNoisyNeighbours(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cgroup.procs"); err != nil {
		t.Skip("no cgroup v1 cpu controller here")
	}
	create(t, "noisy/quiet")
	create(t, "noisy/loud", "--cpus", "0.5", "--disk-bps", "512k")
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
		// 8 MiB of data that is not zeroes (detect-zeroes would not store it), synced, against
		// the loud sandbox's --disk-bps of 512 KiB/s: QEMU holds the guest's writes back, so the
		// host's page cache takes them no faster (a cgroup v1 blkio throttle never saw them).
		// The data is one cached 1 MiB block over and over, which the guest writes faster than
		// that (0.93 MiB/s measured under TCG at --cpus 0.5 on a host at load 12, more on a
		// quiet one); the burner goes first (kill -1 spares the agent, PID 1), so the writer has
		// the guest's CPU.
		stack.Nexus(t, "exec", "noisy/loud", "--", "sh", "-c", "kill -9 -1")
		stack.MustNexus(t, "exec", "noisy/loud", "--", "sh", "-c", `tr "\000" x </dev/zero | head -c 1048576 >/b0 && sync`)
		blkio := cgroupDir(t, pid, "blkio")
		before := ioBytes(t, blkio)
		w0, t0 := writeBytes(t, pid), time.Now()
		noise(t, "noisy/loud", "i=0; while [ $i -lt 8 ]; do cat /b0; i=$((i+1)); done | dd of=/fill bs=1M iflag=fullblock conv=fsync; sync; touch /fill.done")
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
		written, took := writeBytes(t, pid)-w0, time.Since(t0)
		rate := float64(written) / took.Seconds()
		t.Logf("the filler's QEMU wrote %d MiB to the host in %s: %.2f MiB/s (--disk-bps 512k); its cgroup saw %d MiB of disk I/O",
			written>>20, took.Round(time.Millisecond), rate/(1<<20), (ioBytes(t, blkio)-before)>>20)
		if written < 8<<20 {
			t.Errorf("the host saw the filler's QEMU write %d MiB of its 8", written>>20)
		}
		// The throttle's bucket lets a tenth of a second through at once; the rest is slack for
		// the file system's own writes.
		if rate > 1.25*(512<<10) {
			t.Errorf("the filler wrote %.2f MiB/s, over its --disk-bps of 512 KiB/s", rate/(1<<20))
		}
		// The quiet one's own disk writes still go through.
		out, errOut, code := stack.Nexus(t, "exec", "noisy/quiet", "--", "sh", "-c", "echo written >/q && sync && cat /q")
		if code != 0 || out != "written\n" {
			t.Fatalf("the quiet sandbox's disk: exit %d %q %q", code, out, errOut)
		}
	})

	t.Run("forkbomb", func(t *testing.T) {
		noise(t, "noisy/loud", "b() { b | b & }; b")
		pids := cgroupDir(t, pid, "pids")
		mem := cgroupDir(t, pid, "memory")
		quietWhile(t, "noisy/quiet", 10*time.Second)
		// The guest's commands run in a cgroup of their own, so the bomb leaves its agent
		// answering; before, it took the agent down within seconds and the sandbox failed as
		// "hung or panicked".
		// Its commands' cgroup is full, so a new exec starts in the rescue cgroup beside it
		// (the bomb may not take its last tasks) and runs.
		out, errOut, code := stack.Nexus(t, "exec", "noisy/loud", "--", "echo", "alive")
		if code != 0 || out != "alive\n" || state(t, "noisy/loud") != "running" {
			t.Errorf("the fork-bombing sandbox does not answer: exit %d %q %q; %s %s", code, out, errOut, state(t, "noisy/loud"), reason(t, "noisy/loud"))
		}
		if out, errOut, code := stack.Nexus(t, "exec", "noisy/loud", "--", "cat", "/proc/self/cgroup"); code != 0 || !strings.Contains(out, "/nexus-exec/rescue") {
			t.Errorf("an exec during the fork bomb: exit %d, cgroup %q %q; want it in /nexus-exec/rescue", code, out, errOut)
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

// writeBytes is what process pid has written to the host's storage: write_bytes of
// /proc/PID/io, which counts a buffered write when it dirties the page cache.
func writeBytes(t *testing.T, pid int) int64 {
	t.Helper()
	for _, l := range strings.Split(readTrim(t, fmt.Sprintf("/proc/%d/io", pid)), "\n") {
		if v, ok := strings.CutPrefix(l, "write_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no write_bytes in /proc/%d/io", pid)
	return 0
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
