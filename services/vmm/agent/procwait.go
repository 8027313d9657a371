package agent

import (
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// ExecCgroups are the cgroups the guest's commands start in (ExecCgroup, Linux only).
type ExecCgroups struct {
	cmds, rescue    *os.File
	current, events string // cmds' pids.current and pids.events
	max             int    // cmds' pids.max

	mu        sync.Mutex
	refused   int       // cmds' forks refused at its limit, as last read
	refusedAt time.Time // when that count last grew
}

// startProcess starts cmd and returns a function that waits for its exit status. When the agent
// is PID 1 the Reaper does all wait(2) calls (orphans included) and hands our children's status
// over; otherwise the process is waited for directly.
func (s *Server) startProcess(cmd *exec.Cmd) (func() syscall.WaitStatus, error) {
	if s.cfg.ExecCgroup != nil {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, s.cfg.ExecCgroup.fd()
	}
	if s.cfg.Reaper != nil {
		return s.cfg.Reaper.start(cmd)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() syscall.WaitStatus {
		cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
			return ws
		}
		return syscall.WaitStatus(255 << 8)
	}, nil
}

// Reaper reaps every child of the process (PID 1 inherits all orphans) and delivers the status
// of children the agent started to whoever waits for them.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
}

// NewReaper returns a Reaper; call Run to start reaping.
func NewReaper() *Reaper {
	return &Reaper{waiters: map[int]chan syscall.WaitStatus{}}
}

// start starts cmd under the lock so its exit cannot be reaped before it is registered.
func (r *Reaper) start(cmd *exec.Cmd) (func() syscall.WaitStatus, error) {
	r.mu.Lock()
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[cmd.Process.Pid] = ch
	r.mu.Unlock()
	return func() syscall.WaitStatus {
		ws := <-ch
		cmd.Process.Release()
		return ws
	}, nil
}

// Run reaps children until stop is closed.
func (r *Reaper) Run(stop <-chan struct{}) {
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	for {
		r.reapAll()
		select {
		case <-sigs:
		case <-stop:
			return
		}
	}
}

func (r *Reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if ws.Stopped() || ws.Continued() {
			continue
		}
		r.mu.Lock()
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws
		}
		r.mu.Unlock()
	}
}
