package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The guest's commands run in a cgroup of their own (issue 19), so that a fork bomb or a memory
// hog in the guest is refused or killed there and the agent (PID 1, outside it) keeps answering:
// without it a fork bomb took the agent down within seconds and the sandbox failed as hung.
// The cgroup holds every exec'd process (clone3 CLONE_INTO_CGROUP, so not one fork escapes)
// and leaves the agent execReserveMiB of memory and room for its threads.
//
// Inside it, commands start in cmds, which may take all but execRescuePids tasks and
// execRescueMiB of its memory; when cmds is full (a fork bomb took every task it may have), a
// new exec starts in rescue instead, so that the user can still run `pkill` or `echo alive` in
// a sandbox whose own processes ran away.

const (
	execCgroupDir = "/sys/fs/cgroup/nexus-exec"
	// Each task costs the kernel memory of its own that the memory limit does not wholly see
	// (a fork bomb in a 256 MiB guest ran it out of memory at ~1800 tasks): 4 per MiB.
	execPidsPerMiB = 4
	execReserveMiB = 32 // plus an eighth of the guest's memory
	// The commands' share of a busy vCPU against the agent's (a process's weight is 100): they
	// have it all while the agent is idle, and a fork bomb cannot starve its heartbeats.
	execCPUWeight = 10
	// What of the commands' cgroup only rescue may use (see above).
	execRescuePids = 32
	execRescueMiB  = 16
)

// ExecCgroup makes the cgroups the guest's commands run in and returns them, open, for
// Config.ExecCgroup; nil (and why) when the kernel has no cgroup v2 memory and pids controllers.
func ExecCgroup() (*ExecCgroups, error) {
	if err := mount("cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, err
	}
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+memory +pids +cpu"), 0); err != nil {
		return nil, fmt.Errorf("enable the memory, pids and cpu controllers: %w", err)
	}
	if err := os.MkdirAll(execCgroupDir, 0o755); err != nil {
		return nil, err
	}
	_, bytes := memUsed()
	total := int(bytes >> 20)
	limit := total - execReserveMiB - total/8
	if limit < 2*execRescueMiB {
		return nil, fmt.Errorf("%d MiB of memory leaves none for the agent", total)
	}
	pids := max(256, total*execPidsPerMiB)
	if err := writeAll(execCgroupDir, map[string]string{"memory.max": strconv.Itoa(limit) + "M", "pids.max": strconv.Itoa(pids),
		"cpu.weight": strconv.Itoa(execCPUWeight), "cgroup.subtree_control": "+memory +pids"}); err != nil {
		return nil, err
	}
	cmds, rescue := filepath.Join(execCgroupDir, "cmds"), filepath.Join(execCgroupDir, "rescue")
	for _, d := range []string{cmds, rescue} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := writeAll(cmds, map[string]string{"memory.max": strconv.Itoa(limit-execRescueMiB) + "M", "pids.max": strconv.Itoa(pids - execRescuePids)}); err != nil {
		return nil, err
	}
	cg := &ExecCgroups{max: pids - execRescuePids}
	var err error
	if cg.cmds, err = os.Open(cmds); err != nil {
		return nil, err
	}
	if cg.rescue, err = os.Open(rescue); err != nil {
		cg.cmds.Close()
		return nil, err
	}
	cg.current, cg.events = filepath.Join(cmds, "pids.current"), filepath.Join(cmds, "pids.events")
	cg.refused, _ = readInt(cg.events, "max ")
	// A kernel without clone3 into a cgroup would fail every exec: try one first.
	probe := exec.Command("/bin/sh", "-c", "exit 0")
	probe.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.cmds.Fd())}
	if err := probe.Run(); err != nil {
		cg.cmds.Close()
		cg.rescue.Close()
		return nil, fmt.Errorf("start a process in %s: %w", cmds, err)
	}
	return cg, nil
}

func writeAll(dir string, files map[string]string) error {
	for f, v := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
		}
	}
	return nil
}

// fd is the cgroup a command starts in now: cmds, or rescue while cmds is under a fork bomb's
// pressure: fewer than 16 tasks left (its pids.current), or a fork refused at its limit (its
// pids.events) in the last 5 s. Both are read at each start.
func (c *ExecCgroups) fd() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := readInt(c.current, ""); ok && n > c.max-16 {
		return int(c.rescue.Fd())
	}
	if n, ok := readInt(c.events, "max "); ok {
		if n != c.refused {
			c.refused, c.refusedAt = n, time.Now()
		}
		if !c.refusedAt.IsZero() && time.Since(c.refusedAt) < 5*time.Second {
			return int(c.rescue.Fd())
		}
	}
	return int(c.cmds.Fd())
}

// readInt reads the number after prefix on a line of the file (the whole file when prefix is "").
func readInt(path, prefix string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			return n, err == nil
		}
	}
	return 0, false
}
