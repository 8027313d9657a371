package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// maxConsoleLog is the console log size past which Start rotates it to console.log.1.
const maxConsoleLog = 1 << 20

// state is vm.json.
type state struct {
	ID      string    `json:"id"`
	Pid     int       `json:"pid"`
	Accel   string    `json:"accel"`
	RAMPath string    `json:"ram_path"`
	Started time.Time `json:"started"`
	Binary  string    `json:"binary"`
	Spec    *VMSpec   `json:"spec,omitempty"`   // what the VM was started with (snapshots describe the machine from it)
	Cgroup  *vmCgroup `json:"cgroup,omitempty"` // absent for VMs of builds before cgroups (cgroup.go)
	// Containment says how QEMU is contained (jail.go); absent for VMs of builds before it.
	Containment string `json:"containment,omitempty"`
	// Virtiofsd are the pids of the daemons serving its virtiofs mounts (virtiofs.go).
	Virtiofsd []int `json:"virtiofsd,omitempty"`
}

// VM is a handle on one running QEMU process (a hypervisor.VM). Dropping the handle (Close)
// leaves QEMU running.
type VM struct {
	ID  string
	Dir string
	QMP *QMP

	pid         int
	accel       string
	started     time.Time
	ramPath     string
	spec        VMSpec
	pidfd       int
	cg          *vmCgroup // nil: not in a cgroup of its own
	containment string
	virtiofsd   []int  // the daemons serving its virtiofs mounts
	died        string // why the driver stopped it, when it did
	done        chan struct{}
	mu          sync.Mutex
	exitErr     error
}

// Start launches QEMU for spec, detached in its own session, and returns once QMP answers.
func (d *Driver) Start(ctx context.Context, spec VMSpec) (hypervisor.VM, error) {
	return d.start(ctx, spec)
}

func (d *Driver) start(ctx context.Context, spec VMSpec) (*VM, error) {
	if err := validate(&spec); err != nil {
		return nil, err
	}
	accel, err := d.Accelerator(ctx, spec.Kernel, spec.KernelVersion)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	if pid, err := readPid(spec.Dir); err == nil && processAlive(pid) && isOurQEMU(pid, spec.Dir) {
		return nil, errdefs.Conflict("vm %s is already running (pid %d)", spec.ID, pid)
	}
	for _, p := range []string{qmpPath(spec.Dir), AgentSocket(spec.Dir), pidPath(spec.Dir), statePath(spec.Dir)} {
		os.Remove(p)
	}
	rotate(consolePath(spec.Dir), maxConsoleLog)
	// QEMU appends to the console log and creates its sockets with the process umask: the log
	// is made private first, the sockets once QEMU has them (the directory is 0700 as well).
	if f, err := os.OpenFile(consolePath(spec.Dir), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
		f.Close()
		os.Chmod(consolePath(spec.Dir), 0o600)
	}
	ram := spec.RAMPath
	if ram == "" {
		ram = defaultRAMPath(spec.ID, spec.Dir)
	}
	if !spec.Incoming {
		if err := createRAM(ram); err != nil {
			return nil, fmt.Errorf("start %s: guest RAM: %w", spec.ID, err)
		}
	}

	logf, err := os.OpenFile(logPath(spec.Dir), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	defer logf.Close()
	d.diskDefaults(&spec)
	cg, err := newCgroup(cgroupName(spec.ID, spec.Dir), d.limitsFor(&spec, accel))
	if err != nil {
		d.cfg.Logger.Warn().Err(err).Str("vm", spec.ID).Msg("qemu runs without a cgroup of its own")
	}
	now := time.Now()
	uid, gid, containment := d.identity(&spec)
	d.settleVirtiofs(&spec, uid, gid)
	argv := commandLine(&spec, accel, ram, now)
	cmd := exec.Command(d.binary, argv...)
	// Own session: a signal to the vmm's process group (or its death) does not reach QEMU.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var vfs []int
	if d.jailed() {
		if err := prepareJail(&spec, ram, uid, gid); err != nil {
			cg.removeIfAny()
			return nil, fmt.Errorf("start %s: %w", spec.ID, err)
		}
		if vfs, err = d.startVirtiofsd(ctx, &spec, uid, gid, cg); err != nil {
			cg.removeIfAny()
			return nil, fmt.Errorf("start %s: %w", spec.ID, err)
		}
		js, _ := json.Marshal(d.jailFor(&spec, accel, ram, uid, gid, append([]string{d.binary}, argv...)))
		cmd = exec.Command(d.cfg.JailHelper, JailCommand, string(js))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true,
			Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS}
	} else {
		containment = notContained
	}
	cmd.Dir = spec.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		killVirtiofsd(spec.Dir)
		if cg != nil {
			cg.remove()
		}
		return nil, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		pidfd = -1 // pre-5.3 kernel: fall back to signals by pid
	}
	vm := &VM{
		ID: spec.ID, Dir: spec.Dir, pid: cmd.Process.Pid, accel: accel, started: now,
		ramPath: ram, spec: spec, pidfd: pidfd, cg: cg, containment: containment, virtiofsd: vfs, done: make(chan struct{}),
	}
	go func() {
		err := cmd.Wait()
		vm.exited(err)
	}()
	vm.watchVirtiofsd(vfs)
	if cg != nil {
		if err := cg.add(vm.pid); err != nil {
			vm.Kill()
			vm.Close()
			killVirtiofsd(spec.Dir)
			cg.remove()
			return nil, fmt.Errorf("start %s: %w", spec.ID, err)
		}
	}
	st := state{ID: spec.ID, Pid: vm.pid, Accel: accel, RAMPath: ram, Started: now, Binary: d.binary, Spec: &spec, Cgroup: cg,
		Containment: containment, Virtiofsd: vfs}
	b, _ := json.Marshal(st)
	if err := atomicfile.WriteFile(statePath(spec.Dir), b, 0o600); err == nil {
		err = atomicfile.WriteFile(pidPath(spec.Dir), []byte(strconv.Itoa(vm.pid)+"\n"), 0o600)
	}
	if err != nil {
		vm.Kill()
		vm.Close()
		killVirtiofsd(spec.Dir)
		return nil, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	if err := vm.connect(ctx); err != nil {
		vm.Kill()
		vm.Close()
		killVirtiofsd(spec.Dir)
		if l := lastLine(logPath(spec.Dir)); l != "" {
			return nil, fmt.Errorf("start %s: %w: %s", spec.ID, err, l)
		}
		return nil, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	// QEMU has made its sockets by the time QMP answers (the network one is its listener too).
	for _, p := range []string{qmpPath(spec.Dir), AgentSocket(spec.Dir), spec.NetSocket} {
		if p != "" {
			os.Chmod(p, 0o600)
		}
	}
	d.cfg.Logger.Debug().Str("vm", spec.ID).Int("pid", vm.pid).Str("accel", accel).Msg("qemu started")
	return vm, nil
}

// connect waits for the QMP socket and negotiates, giving up if QEMU exits first.
func (vm *VM) connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(qmpPath(vm.Dir)); err == nil {
			q, err := DialQMP(ctx, qmpPath(vm.Dir))
			if err == nil {
				vm.QMP = q
				return nil
			}
		}
		select {
		case <-vm.done:
			return fmt.Errorf("qmp: %w", errExited)
		case <-ctx.Done():
			return fmt.Errorf("qmp: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// Adopt re-attaches to a QEMU started earlier (possibly by another process) in dir. It checks the
// pid really is our QEMU for dir before trusting it. A QEMU that is gone is a not-found error and
// its RAM file is removed.
func (d *Driver) Adopt(ctx context.Context, dir string) (hypervisor.VM, error) {
	b, err := os.ReadFile(statePath(dir))
	if err != nil {
		return nil, errdefs.NotFound("adopt %s: no vm state: %v", dir, err)
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil || st.Pid <= 1 {
		return nil, fmt.Errorf("adopt %s: bad vm.json", dir)
	}
	pid, err := readPid(dir)
	if err != nil || pid != st.Pid {
		return nil, fmt.Errorf("adopt %s: pidfile does not match vm.json", dir)
	}
	// Open the pidfd first and then verify the cmdline: if the pid was reused in between, we
	// verify the new process and reject it, never signal a stranger later.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		removeRAM(st.RAMPath)
		st.Cgroup.removeIfAny()
		return nil, errdefs.NotFound("adopt %s: qemu pid %d is not running", dir, pid)
	}
	if !isOurQEMU(pid, dir) {
		unix.Close(pidfd)
		removeRAM(st.RAMPath)
		st.Cgroup.removeIfAny()
		return nil, errdefs.NotFound("adopt %s: pid %d is not the qemu for this directory", dir, pid)
	}
	// The cgroup is re-attached when QEMU is still in it; a VM of an older build has none.
	if st.Cgroup != nil && !st.Cgroup.holds(pid) {
		st.Cgroup = nil
	}
	vm := &VM{
		ID: st.ID, Dir: dir, pid: pid, accel: st.Accel, started: st.Started,
		ramPath: st.RAMPath, pidfd: pidfd, cg: st.Cgroup, containment: st.Containment, done: make(chan struct{}),
	}
	if vm.containment == "" {
		vm.containment = oldBuild
	}
	if st.Spec != nil {
		vm.spec = *st.Spec
	}
	watchFd, err := unix.Dup(pidfd)
	if err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("adopt %s: %w", dir, err)
	}
	go vm.watchPidfd(watchFd)
	vm.virtiofsd = st.Virtiofsd
	vm.watchVirtiofsd(st.Virtiofsd)
	if err := vm.connect(ctx); err != nil {
		vm.Close()
		return nil, fmt.Errorf("adopt %s: %w", dir, err)
	}
	return vm, nil
}

// watchPidfd waits for a process we are not the parent of to exit. It owns fd (a dup of the
// handle's pidfd) so Close on the handle cannot turn the poll into a false exit.
func (vm *VM) watchPidfd(fd int) {
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if err != nil && errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil && fds[0].Revents&unix.POLLIN != 0 {
			vm.exited(nil)
		}
		return
	}
}

func (vm *VM) exited(err error) {
	vm.mu.Lock()
	select {
	case <-vm.done:
		vm.mu.Unlock()
		return
	default:
	}
	vm.exitErr = err
	removeRAM(vm.ramPath)
	close(vm.done)
	vm.mu.Unlock()
}

// Pid is the QEMU process.
func (vm *VM) Pid() int { return vm.pid }

// Accel is the accelerator QEMU runs the guest under: kvm or tcg.
func (vm *VM) Accel() string { return vm.accel }

// Started is when QEMU was started.
func (vm *VM) Started() time.Time { return vm.started }

// Done is closed when QEMU has exited.
func (vm *VM) Done() <-chan struct{} { return vm.done }

// Wait blocks until QEMU exits or ctx ends. For a VM we started, the error is QEMU's exit status.
func (vm *VM) Wait(ctx context.Context) error {
	select {
	case <-vm.done:
		vm.mu.Lock()
		defer vm.mu.Unlock()
		return vm.exitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Exited reports whether QEMU has exited.
func (vm *VM) Exited() bool {
	select {
	case <-vm.done:
		return true
	default:
		return false
	}
}

// Pause stops the vCPUs.
func (vm *VM) Pause(ctx context.Context) error {
	_, err := vm.QMP.Execute(ctx, "stop", nil)
	return err
}

// Resume restarts the vCPUs.
func (vm *VM) Resume(ctx context.Context) error {
	_, err := vm.QMP.Execute(ctx, "cont", nil)
	return err
}

// Status is QMP query-status: running, paused, shutdown, internal-error, ….
func (vm *VM) Status(ctx context.Context) (string, error) {
	raw, err := vm.QMP.Execute(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var s struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("qmp query-status: %w", err)
	}
	return s.Status, nil
}

// Paused reports whether the vCPUs are stopped: paused, or stopped by SaveState (postmigrate).
func (vm *VM) Paused(ctx context.Context) (bool, error) {
	st, err := vm.Status(ctx)
	return st == "paused" || st == "postmigrate", err
}

// AgentPortOpened signals each time the guest opens the agent's virtio-serial port.
func (vm *VM) AgentPortOpened(ctx context.Context) <-chan struct{} { return vm.QMP.PortOpened(ctx) }

// Kill sends SIGKILL and waits until the process is gone.
func (vm *VM) Kill() error {
	if vm.Exited() {
		return nil
	}
	if err := vm.signal(unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %s: %w", vm.ID, err)
	}
	select {
	case <-vm.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("kill %s: pid %d still running after SIGKILL", vm.ID, vm.pid)
	}
}

// signal delivers sig through the pidfd (immune to pid reuse), or by pid once the handle is closed.
func (vm *VM) signal(sig unix.Signal) error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.pidfd >= 0 {
		return unix.PidfdSendSignal(vm.pidfd, sig, nil, 0)
	}
	if !isOurQEMU(vm.pid, vm.Dir) {
		return unix.ESRCH
	}
	return unix.Kill(vm.pid, sig)
}

// Close drops the handle (QMP connection, pidfd) and leaves QEMU running.
func (vm *VM) Close() error {
	if vm.QMP != nil {
		vm.QMP.Close()
	}
	vm.mu.Lock()
	if vm.pidfd >= 0 {
		unix.Close(vm.pidfd)
		vm.pidfd = -1
	}
	vm.mu.Unlock()
	return nil
}

// Cleanup removes what Start left in the directory once QEMU has exited: pidfile, state,
// sockets and the RAM file. The console log stays for `nexus logs`.
func (vm *VM) Cleanup() error {
	if !vm.Exited() {
		return errdefs.Conflict("vm %s is still running", vm.ID)
	}
	vm.Close()
	removeRAM(vm.ramPath)
	if len(vm.virtiofsd) > 0 {
		killVirtiofsd(vm.Dir)
	}
	var errs []error
	if err := vm.cg.removeIfAny(); err != nil {
		errs = append(errs, err)
	}
	for _, p := range []string{qmpPath(vm.Dir), AgentSocket(vm.Dir), pidPath(vm.Dir), statePath(vm.Dir)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RAMPath is the guest RAM file.
func (vm *VM) RAMPath() string { return vm.ramPath }

func removeRAM(p string) {
	if p != "" && strings.HasPrefix(filepath.Base(p), "nexus-") {
		os.Remove(p)
		// The RAM file's own directory (defaultRAMPath), once empty.
		if dir := filepath.Dir(p); filepath.Dir(dir) == "/dev/shm" && strings.HasPrefix(filepath.Base(dir), "nexus-") {
			os.Remove(dir)
		}
	}
}

func readPid(dir string) (int, error) {
	b, err := os.ReadFile(pidPath(dir))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("bad pidfile %s", pidPath(dir))
	}
	return pid, nil
}

func processAlive(pid int) bool { return unix.Kill(pid, 0) == nil }

// isOurQEMU checks /proc/<pid>/cmdline: a qemu-system binary whose QMP socket is dir's.
func isOurQEMU(pid int, dir string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return false
	}
	args := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	if !strings.HasPrefix(filepath.Base(string(args[0])), "qemu-system") {
		return false
	}
	want := "unix:" + qmpPath(dir) + ",server=on,wait=off"
	for i := 0; i+1 < len(args); i++ {
		if string(args[i]) == "-qmp" && string(args[i+1]) == want {
			return true
		}
	}
	return false
}

// rotate moves a file past max bytes to <path>.1, replacing an older rotation.
func rotate(path string, max int64) {
	if st, err := os.Stat(path); err == nil && st.Size() > max {
		os.Rename(path, path+".1")
	}
}

var _ hypervisor.Health = (*VM)(nil)

// DiskErrors counts the BLOCK_IO_ERROR events QEMU raised since the handle connected.
func (vm *VM) DiskErrors() hypervisor.DiskErrors {
	if vm.QMP == nil {
		return hypervisor.DiskErrors{}
	}
	return vm.QMP.DiskErrors()
}

// ExitReason says why QEMU exited when the driver knows; see cgroup.go.
func (vm *VM) ExitReason() string {
	vm.mu.Lock()
	died := vm.died
	vm.mu.Unlock()
	if died != "" {
		return died
	}
	return vm.oomReason()
}
