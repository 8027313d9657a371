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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Live worktree mounts over virtiofs (issue 24). 9p is served by QEMU itself, and every
// metadata operation of a `git status` is a round trip through it with nothing cached
// (cache=mmap); virtiofs lets the guest kernel cache entries and attributes for a bounded time
// and serves them from a daemon of its own, virtiofsd, beside QEMU.
//
// Each virtiofs share gets its own virtiofsd, started by the vmm before QEMU through the jail
// helper (jail.go) and holding no more privilege than the share's owner:
//   - it runs as root in a user namespace of its own that maps that one root to the share's
//     owner and maps no other uid or gid, so what it creates is the owner's on the host, and
//     what it may open is what the owner may (its capabilities count only inside that
//     namespace, over the owner's files); no supplementary groups;
//   - its own sandbox (-o sandbox=namespace) pivot_roots into the shared directory in new
//     mount, PID and network namespaces, so no path the guest sends (`..`, an absolute
//     symlink) resolves outside it, and it installs its own seccomp filter;
//   - it joins the VM's cgroup, so the VM's limits count it.
//
// Its lifetime is the VM's: QEMU connects once at start; virtiofsd exits when that connection
// closes (QEMU exited), and QEMU is killed when virtiofsd exits first, so a sandbox never runs
// on with a dead mount. Both live in sessions of their own and outlive a vmm restart; Adopt
// finds the daemons again from vm.json and, when one is gone, stops the VM.
//
// The cache mode is chosen for the coherence a user relies on and pinned by a test: cache=auto
// keeps no file data across opens (the page cache is dropped when a file is opened again) and
// caches entries and attributes for virtiofsTimeout, so a host edit shows in the guest within
// that time; a guest write goes through to virtiofsd before the write returns (no writeback).
//
// What that costs (BenchmarkMountedGitStatus, 3,000 files, TCG on a shared 2-core host,
// December 2026): a `git status` after a pause is one FUSE LOOKUP per tracked file (~3,100;
// plus ~100 for the untracked scan's readdirs), since git lstats every file and the cached
// entries have expired: 2.2 s of a 2.7 s run is git's preload-index phase (ext4: 0.06 of 0.33 s).
// The LOOKUPs cost the VM ~0.2 ms of CPU each, nearly all in the vCPU thread (the guest's FUSE
// and virtio path, emulated); QEMU's main loop and virtiofsd take ~0.03 ms each. The mounted run
// is 2.3x the guest's ext4 at load 3-6 and 2.7-2.8x at load 9-17 (median of per-round ratios).
// Measured and not taken, one run each: a longer timeout (0.9 s would still show a host edit
// within 1 s), because one git status outlasts it and the next finds the entries expired all the
// same (2.9-3.4x with 0.9); --thread-pool-size=0 (ratio 2.81 vs 2.84: noise); -o no_readdirplus
// (git status the same, `ls -lR` 3.4x slower); cache=always with the same timeout (directories and
// file data kept: 3.51 vs 3.13, nothing gained); 2 vCPUs (3.0-3.6x); priming the entries with a
// readdir walk (find, or a core.fsmonitor hook running one) before git's lstats (slower: the walk
// costs more than it saves); -o writeback (a guest write must be on the host when the command
// returns, and git status writes nothing). git's core.untrackedCache would save only the readdir
// phase, and its cache in the index names the worktree's path, so git on the host and in the guest
// over one worktree would each find the other's and warn "untracked cache is disabled on this
// system or location".

// virtiofsCache and virtiofsTimeout are virtiofsd's cache options (see above).
const (
	virtiofsCache   = "auto"
	virtiofsTimeout = "0.5"
)

// DefaultVirtiofsd is where QEMU 7.2's virtiofsd is installed (Debian: qemu-system-common).
const DefaultVirtiofsd = "/usr/lib/qemu/virtiofsd"

// vfsSocket is the vhost-user socket of the i-th mount's virtiofsd; vfsLog its stderr.
func vfsSocket(dir string, i int) string { return filepath.Join(dir, "vfs"+strconv.Itoa(i)+".sock") }
func vfsLog(dir string, i int) string    { return filepath.Join(dir, "virtiofsd"+strconv.Itoa(i)+".log") }

// settleVirtiofs clears Virtiofs on the mounts the driver cannot serve so: without virtiofsd,
// outside the jail (the vmm is not root: no user namespace mapped to the owner), on a restore
// (a vhost-user device cannot be migrated, and a restored VM's RAM is private), or where the
// share's owner is not the uid QEMU runs as (QEMU reaches the socket in the sandbox directory,
// which is that uid's), or where the owner cannot reach the share (a directory above it is
// closed to them; 9p is bound into QEMU's root by root).
func (d *Driver) settleVirtiofs(spec *VMSpec, uid, gid int) {
	can := d.cfg.Virtiofsd != "" && d.jailed() && !spec.Incoming
	for i := range spec.Mounts {
		m := &spec.Mounts[i]
		if !m.Virtiofs {
			continue
		}
		var st unix.Stat_t
		m.Virtiofs = can && unix.Stat(m.HostPath, &st) == nil && int(st.Uid) == uid && reachable(m.HostPath, uid, gid)
	}
}

// reachable says whether uid:gid (no supplementary groups) may search every directory from /
// down to dir, dir included.
func reachable(dir string, uid, gid int) bool {
	if uid == 0 {
		return true
	}
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil {
			return false
		}
		bit := uint32(0o001)
		switch {
		case int(st.Uid) == uid:
			bit = 0o100
		case int(st.Gid) == gid:
			bit = 0o010
		}
		if st.Mode&bit == 0 {
			return false
		}
		if p == "/" {
			return true
		}
	}
}

// virtiofsdArgs is the i-th mount's virtiofsd command line.
func (d *Driver) virtiofsdArgs(spec *VMSpec, i int) []string {
	a := []string{d.cfg.Virtiofsd,
		// Relative: the helper starts it in the sandbox directory, whose parents the owner
		// may not search.
		"--socket-path=" + filepath.Base(vfsSocket(spec.Dir, i)),
		"-o", "source=" + spec.Mounts[i].HostPath,
		"-o", "sandbox=namespace",
		"-o", "cache=" + virtiofsCache,
		"-o", "timeout=" + virtiofsTimeout,
		"-o", "no_posix_lock", "-o", "no_flock", "-o", "no_xattr",
	}
	// One O_PATH descriptor per inode the guest holds: the default soft limit (1024) is too few
	// for a worktree, and raising past the hard limit needs a capability it does not have.
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Max > 1024 {
		a = append(a, "--rlimit-nofile="+strconv.FormatUint(min(rl.Max, 1<<20), 10))
	} else {
		a = append(a, "--rlimit-nofile=0")
	}
	return a
}

// startVirtiofsd starts the virtiofsd of every virtiofs mount of spec, as uid:gid, and waits
// until each listens. On error none is left running.
func (d *Driver) startVirtiofsd(ctx context.Context, spec *VMSpec, uid, gid int, cg *vmCgroup) ([]int, error) {
	killVirtiofsd(spec.Dir) // one a crashed vmm left waiting
	var pids []int
	fail := func(err error) ([]int, error) {
		killVirtiofsd(spec.Dir)
		return nil, err
	}
	for i, m := range spec.Mounts {
		if !m.Virtiofs {
			continue
		}
		sock := vfsSocket(spec.Dir, i)
		os.Remove(sock)
		logf, err := os.OpenFile(vfsLog(spec.Dir, i), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return fail(err)
		}
		dirf, err := os.Open(spec.Dir)
		if err != nil {
			logf.Close()
			return fail(err)
		}
		js, _ := json.Marshal(jailSpec{Virtiofsd: true, Root: spec.Dir, Argv: d.virtiofsdArgs(spec, i)})
		cmd := exec.Command(d.cfg.JailHelper, JailCommand, string(js))
		cmd.Dir = "/"
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.ExtraFiles = []*os.File{dirf} // fd 3: the helper's working directory
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true,
			Cloneflags:                 unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}},
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
		}
		err = cmd.Start()
		logf.Close()
		dirf.Close()
		if err != nil {
			return fail(fmt.Errorf("virtiofsd for %s: %w", m.HostPath, err))
		}
		pids = append(pids, cmd.Process.Pid)
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		if cg != nil {
			if err := cg.add(cmd.Process.Pid); err != nil {
				return fail(err)
			}
		}
		if err := waitListening(ctx, sock, exited); err != nil {
			if l := lastLine(vfsLog(spec.Dir, i)); l != "" {
				err = fmt.Errorf("%w: %s", err, l)
			}
			return fail(fmt.Errorf("virtiofsd for %s: %w", m.HostPath, err))
		}
	}
	return pids, nil
}

// waitListening waits for virtiofsd's socket, giving up when it exits first.
func waitListening(ctx context.Context, sock string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if st, err := os.Stat(sock); err == nil && st.Mode()&os.ModeSocket != 0 {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before it listened")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// vfsEnv names, in a virtiofsd's environment, the sandbox directory it serves: its command line
// names only its socket relative to where it started, and it moves to / at once.
const vfsEnv = "NEXUS_VIRTIOFS_SANDBOX="

// isOurVirtiofsd says whether pid is a virtiofsd the vmm started for dir (or the daemon that
// one forked into its own namespaces, which dies with it).
func isOurVirtiofsd(pid int, dir string) bool {
	p := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(p + "/comm")
	if err != nil || !bytes.HasPrefix(b, []byte("virtiofsd")) {
		return false
	}
	env, err := os.ReadFile(p + "/environ")
	return err == nil && slices.Contains(strings.Split(string(env), "\x00"), vfsEnv+dir)
}

// killVirtiofsd ends every daemon still serving a socket of dir (found in /proc, so also one a
// vmm that crashed before it wrote vm.json left waiting for its QEMU) and waits, bounded, until
// they are gone, so the VM's cgroup can be removed.
func killVirtiofsd(dir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		if !isOurVirtiofsd(pid, dir) {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		if isOurVirtiofsd(pid, dir) && unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			unix.Poll(fds, 2000)
		}
		unix.Close(fd)
	}
}

// watchVirtiofsd kills the VM when one of its daemons exits first: its guest would run on with
// a dead mount. A daemon already gone (found so by Adopt) kills it at once.
func (vm *VM) watchVirtiofsd(pids []int) {
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil || !isOurVirtiofsd(pid, vm.Dir) {
			if err == nil {
				unix.Close(fd)
			}
			vm.mountDied()
			return
		}
		go func() {
			defer unix.Close(fd)
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			for {
				_, err := unix.Poll(fds, -1)
				if errors.Is(err, unix.EINTR) {
					continue
				}
				// QEMU exiting closes the connection, and virtiofsd exits after it: only a
				// daemon that goes while QEMU stays is a dead mount.
				select {
				case <-vm.done:
				case <-time.After(2 * time.Second):
					vm.mountDied()
				}
				return
			}
		}()
	}
}

// mountDied stops the VM because the virtiofsd of one of its mounts is gone.
func (vm *VM) mountDied() {
	vm.mu.Lock()
	if vm.died == "" {
		vm.died = "the virtiofsd serving a live mount exited, so the VM was stopped"
	}
	vm.mu.Unlock()
	vm.Kill()
}
