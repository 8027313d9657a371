package qemu

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// QEMU is contained the way Firecracker's jailer contains Firecracker (issue 19): the vmm starts
// QEMU through a small helper, this package's JailMain run as a hidden subcommand of the nexus
// binary, in a new mount, PID, IPC and UTS namespace. The helper builds a private root on a tmpfs
// holding only what this VM needs at the paths QEMU's command line names (the QEMU binary and its
// libraries read-only, the kernel, initramfs and base images read-only, the sandbox directory
// with its disk and sockets, its volumes, its RAM file, its mounts, a minimal /dev and the /proc
// of its own PID namespace), pivot_roots into it, drops to the VM's uid and execs QEMU, whose
// own seccomp filter (-sandbox …) then forbids privilege changes, spawning and the obsolete and
// resource-control system calls. QEMU's host pid is the helper's, so pidfiles, pidfds and
// adoption are unchanged; the QMP, agent and network sockets stay in the sandbox directory,
// which the vmm (root) reaches as before.
//
// One uid for every VM (Config.UID, default 61000), not one per sandbox: forks and templates map
// a parent's RAM file and read its disk chain, which per-sandbox uids would have to share again
// through group permissions; what keeps one QEMU from another's files is the private root (it
// cannot name them) and the PID namespace (it cannot see or signal the others), with the uid
// keeping it from everything root owns. A sandbox with host mounts is served over 9p from inside
// QEMU, so its QEMU runs as the mounts' owner instead; when that owner is root (or the mounts
// have different owners) QEMU runs as root, still in its namespace and filter, and the vmm says
// the sandbox is less contained (VM.Containment).

// JailCommand is the hidden subcommand of the nexus binary that runs JailMain.
const JailCommand = "__qemu-jail"

// DefaultUID is the uid (and gid) QEMU runs as when nothing else is configured.
const DefaultUID = 61000

// sandboxFilter is QEMU's own seccomp filter for every VM.
const sandboxFilter = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// jailSpec is what the helper is told, as JSON in its one argument.
type jailSpec struct {
	Root  string     `json:"root"` // an empty directory to build the private root on
	UID   int        `json:"uid"`
	GID   int        `json:"gid"`
	Binds []jailBind `json:"binds"`
	Devs  []string   `json:"devs"` // device nodes bound into /dev
	Argv  []string   `json:"argv"` // QEMU's, argv[0] its absolute path
	// Virtiofsd: the helper runs in the user and mount namespaces of a virtiofsd (virtiofs.go)
	// and only gives it a private /run before it execs it; virtiofsd contains itself. Root is
	// then the sandbox directory, named in its environment (vfsEnv) so the vmm finds it again.
	Virtiofsd bool `json:"virtiofsd,omitempty"`
}

// jailBind is a host path bound into the root at the same path.
type jailBind struct {
	Path string `json:"path"`
	RO   bool   `json:"ro,omitempty"`
}

// systemPaths are bound read-only so QEMU and its libraries load; symlinks (merged /usr) are
// recreated as symlinks.
var systemPaths = []string{"/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime"}

// JailMain is the helper: it builds the private root, drops to the uid and execs QEMU. It runs as
// root in the new namespaces the vmm created it in, and never returns on success.
func JailMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "nexus "+JailCommand+": internal helper of the vmm")
		return 2
	}
	var js jailSpec
	if err := json.Unmarshal([]byte(args[0]), &js); err != nil {
		fmt.Fprintln(os.Stderr, "qemu jail:", err)
		return 2
	}
	if err := js.enter(); err != nil {
		fmt.Fprintln(os.Stderr, "qemu jail:", err)
		return 1
	}
	return 1 // not reached
}

func (js *jailSpec) enter() error {
	runtime.LockOSThread()
	if js.Virtiofsd {
		return js.enterVirtiofsd()
	}
	if os.Getpid() != 1 {
		return errors.New("not in a PID namespace of its own")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := js.Root
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0755"); err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	for _, p := range systemPaths {
		if err := bindInto(root, p, true, true); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	// The root's own /dev, /proc and /tmp first: the binds below may land inside them (the RAM
	// file in /dev/shm, a home under /tmp).
	dev := filepath.Join(root, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,mode=0755"); err != nil {
		return fmt.Errorf("/dev: %w", err)
	}
	proc := filepath.Join(root, "proc")
	os.MkdirAll(proc, 0o555)
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("/proc: %w", err)
	}
	tmp := filepath.Join(root, "tmp")
	os.MkdirAll(tmp, 0o1777)
	if err := unix.Mount("tmpfs", tmp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=1777"); err != nil {
		return fmt.Errorf("/tmp: %w", err)
	}
	for _, d := range append([]string{"/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random"}, js.Devs...) {
		if err := bindInto(root, d, false, false); err != nil {
			return err
		}
	}
	for _, b := range js.Binds {
		if err := bindInto(root, b.Path, b.RO, false); err != nil {
			return err
		}
	}
	// pivot_root into the root and drop the old one.
	if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind root: %w", err)
	}
	old := filepath.Join(root, ".old")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.old", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("drop the old root: %w", err)
	}
	os.Remove("/.old")
	// The root tmpfs is read-only from now on.
	unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, "")
	if js.UID != 0 {
		if err := syscall.Setgroups(nil); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if err := syscall.Setresgid(js.GID, js.GID, js.GID); err != nil {
			return fmt.Errorf("setgid %d: %w", js.GID, err)
		}
		if err := syscall.Setresuid(js.UID, js.UID, js.UID); err != nil {
			return fmt.Errorf("setuid %d: %w", js.UID, err)
		}
	}
	unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	env := []string{"PATH=/usr/bin:/bin"}
	return syscall.Exec(js.Argv[0], js.Argv, env)
}

// bindInto binds host path p at the same path under root. A symlink is recreated when
// keepLinks is set (merged-/usr systems link /lib to usr/lib).
func bindInto(root, p string, ro, keepLinks bool) error {
	st, err := os.Lstat(p)
	if err != nil {
		return err
	}
	dst := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if keepLinks && st.Mode()&os.ModeSymlink != 0 {
		t, err := os.Readlink(p)
		if err != nil {
			return err
		}
		return os.Symlink(t, dst)
	}
	if st, err = os.Stat(p); err != nil {
		return err
	}
	if st.IsDir() {
		err = os.MkdirAll(dst, 0o755)
	} else if _, serr := os.Lstat(dst); serr != nil {
		var f *os.File
		f, err = os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o600)
		if f != nil {
			f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("bind %s: %w", p, err)
	}
	// Not recursive: what is mounted below p (the root being built, under the sandbox
	// directory) stays out.
	if err := unix.Mount(p, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", p, err)
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID)
	if ro {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s: %w", p, err)
	}
	return nil
}

// backingChain is a qcow2 image's backing files, read from the headers (QEMU opens each by its
// recorded path, so each must be in the root at that path).
func backingChain(img string) []string {
	var out []string
	for range 16 {
		b, err := readBacking(img)
		if err != nil || b == "" {
			return out
		}
		if !filepath.IsAbs(b) {
			b = filepath.Join(filepath.Dir(img), b)
		}
		out = append(out, b)
		img = b
	}
	return out
}

// readBacking reads the backing file name from a qcow2 header; "" for a raw image or none.
func readBacking(img string) (string, error) {
	f, err := os.Open(img)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var h [20]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return "", nil
	}
	if string(h[:4]) != "QFI\xfb" {
		return "", nil
	}
	off := binary.BigEndian.Uint64(h[8:16])
	size := binary.BigEndian.Uint32(h[16:20])
	if off == 0 || size == 0 || size > 1023 {
		return "", nil
	}
	name := make([]byte, size)
	if _, err := f.ReadAt(name, int64(off)); err != nil {
		return "", err
	}
	return string(name), nil
}

// identity is the uid and gid QEMU runs as for spec, and what that means for the sandbox's
// containment: the configured VM uid without mounts; the mounts' owner with mounts (9p is served
// by QEMU itself), which is root for a root-owned mount.
func (d *Driver) identity(spec *VMSpec) (uid, gid int, containment string) {
	uid, gid = d.cfg.UID, d.cfg.GID
	if len(spec.Mounts) == 0 {
		return uid, gid, "contained"
	}
	owner, ogid := -1, -1
	for _, m := range spec.Mounts {
		var st unix.Stat_t
		if unix.Stat(m.HostPath, &st) != nil {
			continue
		}
		switch {
		case owner == -1:
			owner, ogid = int(st.Uid), int(st.Gid)
		case owner != int(st.Uid):
			return 0, 0, "less contained: its mounts have different owners, so QEMU (which serves them over 9p) runs as root"
		}
	}
	switch owner {
	case -1:
		return uid, gid, "contained"
	case 0:
		return 0, 0, "less contained: QEMU serves the root-owned mount " + spec.Mounts[0].HostPath + " over 9p and runs as root"
	}
	return owner, ogid, "contained; QEMU runs as uid " + strconv.Itoa(owner) + ", the owner of its mounts, to serve them over 9p"
}

// jailFor is the helper's spec for spec: every path QEMU's command line names.
func (d *Driver) jailFor(spec *VMSpec, accel, ram string, uid, gid int, argv []string) jailSpec {
	js := jailSpec{Root: filepath.Join(spec.Dir, "root"), UID: uid, GID: gid, Argv: argv}
	// One bind per path: a path named twice (a host directory mounted rw and ro, say) is bound
	// once, writable if any use needs it — a second bind would stack over the first and make
	// every use of the path see the last one's mode. QEMU enforces each 9p export's own ro.
	add := func(p string, ro bool) {
		for i := range js.Binds {
			if js.Binds[i].Path == p {
				js.Binds[i].RO = js.Binds[i].RO && ro
				return
			}
		}
		js.Binds = append(js.Binds, jailBind{Path: p, RO: ro})
	}
	add(spec.Dir, false)
	add(spec.Kernel, true)
	add(spec.Initrd, true)
	disks := []Disk{}
	if spec.Disk != "" {
		disks = append(disks, Disk{Path: spec.Disk})
	}
	disks = append(disks, spec.ExtraDisks...)
	for _, dk := range disks {
		if filepath.Dir(dk.Path) != spec.Dir {
			add(dk.Path, dk.ReadOnly)
		}
		for _, b := range backingChain(dk.Path) {
			add(b, true)
		}
	}
	for _, m := range spec.Mounts {
		if !m.Virtiofs { // a virtiofs share is virtiofsd's to open, never QEMU's
			add(m.HostPath, m.ReadOnly)
		}
	}
	if spec.NetSocket != "" && filepath.Dir(spec.NetSocket) != spec.Dir {
		add(filepath.Dir(spec.NetSocket), false)
	}
	add(ram, false)
	if accel == AccelKVM {
		js.Devs = append(js.Devs, "/dev/kvm")
	}
	return js
}

// prepareJail gives the VM's uid what it must open: the sandbox directory and its logs, the
// disks and volumes, the RAM file and
// the empty directory the root is built on.
func prepareJail(spec *VMSpec, ram string, uid, gid int) error {
	root := filepath.Join(spec.Dir, "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	paths := []string{spec.Dir, consolePath(spec.Dir), logPath(spec.Dir)}
	if spec.Disk != "" {
		paths = append(paths, spec.Disk)
	}
	for _, dk := range spec.ExtraDisks {
		if !dk.ReadOnly {
			paths = append(paths, dk.Path)
		}
	}
	// The RAM file (made 0600 by createRAM; a restore's is the snapshot's, opened read-write and
	// mapped privately, never written) is bound in by itself, so its 0700 directory stays root's.
	paths = append(paths, ram)
	if f, err := os.OpenFile(consolePath(spec.Dir), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
		f.Close()
	}
	// Backing images are bound read-only; one only its owner may read (a snapshot's disk, 0600)
	// is given to the uid, which still cannot write it.
	for _, dk := range append([]Disk{{Path: spec.Disk}}, spec.ExtraDisks...) {
		if dk.Path == "" {
			continue
		}
		for _, b := range backingChain(dk.Path) {
			if st, err := os.Stat(b); err == nil && st.Mode().Perm()&0o004 == 0 {
				paths = append(paths, b)
			}
		}
	}
	for _, p := range paths {
		if err := os.Lchown(p, uid, gid); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("chown %s: %w", p, err)
		}
	}
	return nil
}

// What Containment says of a QEMU started without the helper, and of one an earlier build started.
const (
	notContained = "not contained: the vmm does not run as root, so QEMU runs as its user without a private root"
	oldBuild     = "not contained: started by an earlier nexus build (QEMU as root, no private root, no seccomp filter); restart the sandbox to contain it"
)

// Containment says how QEMU is contained: "contained", or why less or not.
func (vm *VM) Containment() string { return vm.containment }

// jailed says whether QEMU is started through the helper: the vmm runs as root and knows the
// helper binary.
func (d *Driver) jailed() bool { return d.cfg.JailHelper != "" && os.Geteuid() == 0 }

// enterVirtiofsd execs virtiofsd in the sandbox directory with a private /run: as root it
// writes its pid lock under /run/virtiofsd, which root of its user namespace (the share's
// owner) cannot create on the host.
func (js *jailSpec) enterVirtiofsd() error {
	if len(js.Argv) == 0 || !filepath.IsAbs(js.Argv[0]) {
		return errors.New("no virtiofsd to run")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,mode=0755"); err != nil {
		return fmt.Errorf("/run: %w", err)
	}
	// fd 3 is the sandbox directory, where its socket goes: reached through the descriptor the
	// vmm opened, since the owner may not search the directories above it.
	if err := unix.Fchdir(3); err != nil {
		return fmt.Errorf("sandbox directory: %w", err)
	}
	unix.Close(3)
	return syscall.Exec(js.Argv[0], js.Argv, []string{"PATH=/usr/bin:/bin", vfsEnv + js.Root})
}
