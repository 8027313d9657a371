package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// The guest's commands run in a cgroup of their own (issue 19), so that a fork bomb or a memory
// hog in the guest is refused or killed there and the agent (PID 1, outside it) keeps answering:
// without it a fork bomb took the agent down within seconds and the sandbox failed as hung.
// The cgroup holds every exec'd process (clone3 CLONE_INTO_CGROUP, so not one fork escapes)
// and leaves the agent execReserveMiB of memory and room for its threads.

const (
	execCgroupDir = "/sys/fs/cgroup/nexus-exec"
	// Each task costs the kernel memory of its own that the memory limit does not wholly see
	// (a fork bomb in a 256 MiB guest ran it out of memory at ~1800 tasks): 4 per MiB.
	execPidsPerMiB = 4
	execReserveMiB = 32 // plus an eighth of the guest's memory
	// The commands' share of a busy vCPU against the agent's (a process's weight is 100): they
	// have it all while the agent is idle, and a fork bomb cannot starve its heartbeats.
	execCPUWeight = 10
)

// ExecCgroup makes the cgroup the guest's commands run in and returns it, open, for
// Config.ExecCgroup; nil (and why) when the kernel has no cgroup v2 memory and pids controllers.
func ExecCgroup() (*os.File, error) {
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
	if limit < 32 {
		return nil, fmt.Errorf("%d MiB of memory leaves none for the agent", total)
	}
	for f, v := range map[string]string{"memory.max": strconv.Itoa(limit) + "M", "pids.max": strconv.Itoa(max(256, total*execPidsPerMiB)),
		"cpu.weight": strconv.Itoa(execCPUWeight)} {
		if err := os.WriteFile(filepath.Join(execCgroupDir, f), []byte(v), 0); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	dir, err := os.Open(execCgroupDir)
	if err != nil {
		return nil, err
	}
	// A kernel without clone3 into a cgroup would fail every exec: try one first.
	probe := exec.Command("/bin/sh", "-c", "exit 0")
	probe.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	if err := probe.Run(); err != nil {
		dir.Close()
		return nil, fmt.Errorf("start a process in %s: %w", execCgroupDir, err)
	}
	return dir, nil
}
