// Package qemu drives QEMU `-M microvm` guests (DESIGN §4): it builds the command line, starts
// QEMU detached in its own session so guests outlive a restart of the vmm service, controls it
// over QMP, and re-adopts a running QEMU from its pidfile and QMP socket.
//
// Files in a VM's directory:
//
//	qemu.pid      the QEMU pid
//	vm.json       what Adopt needs: pid, accelerator, RAM file, start time
//	qmp.sock      QMP control socket
//	agent.sock    the guest agent's virtio-serial port (nexus.agent)
//	console.log   the guest serial console (appended; rotated on start past 1 MiB)
//	qemu.log      QEMU's own stderr
//
// Guest RAM is a shared memory-backend-file in /dev/shm so snapshots can later save it without
// copying; the file is removed when QEMU is seen to exit.
package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// Accelerator names.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// Config configures the driver.
type Config struct {
	// Binary is the QEMU system emulator; default qemu-system-x86_64 from PATH.
	Binary string
	// Accel is auto (probe KVM with a real boot, cached), kvm or tcg.
	Accel string
	// CacheDir holds accel.json and the probe initramfs, normally $NEXUS_HOME/cache.
	CacheDir string
	// ProbeTimeout bounds the KVM probe boot; default 5s (a working KVM reaches /init in under 1s).
	ProbeTimeout time.Duration
	Logger       zerolog.Logger
	// DiskBps and DiskIOPS throttle the reads and writes (each direction) of a VM whose Spec
	// asks for no limit of its own, in QEMU and its cgroup; default 256 MiB/s and 8192.
	DiskBps, DiskIOPS uint64
	// JailHelper is the nexus binary, whose hidden subcommand JailCommand starts QEMU contained
	// (jail.go); empty (tests of this package), or a vmm not running as root, starts QEMU directly.
	JailHelper string
	// UID and GID are what QEMU runs as when contained; default DefaultUID.
	UID, GID int
	// Virtiofsd is QEMU's virtiofsd (DefaultVirtiofsd), which serves the mounts a spec asks to
	// have over virtiofs (virtiofs.go); empty serves every mount over 9p.
	Virtiofsd string
}

// Driver starts, restores and adopts QEMU microVMs: the hypervisor.Driver of QEMU.
type Driver struct {
	cfg     Config
	binary  string
	version string

	mu    sync.Mutex
	accel map[string]string // probe results by cache key, this process
}

// New checks that QEMU is installed and reads its version.
func New(cfg Config) (*Driver, error) {
	if cfg.Binary == "" {
		cfg.Binary = "qemu-system-x86_64"
	}
	switch cfg.Accel {
	case "":
		cfg.Accel = AccelAuto
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		return nil, errdefs.Invalid("qemu: accelerator %q is not one of auto, kvm, tcg", cfg.Accel)
	}
	if cfg.UID == 0 {
		cfg.UID, cfg.GID = DefaultUID, DefaultUID
	}
	if cfg.DiskBps == 0 {
		cfg.DiskBps = defaultDiskBps
	}
	if cfg.DiskIOPS == 0 {
		cfg.DiskIOPS = defaultDiskIOPS
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 5 * time.Second
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, errdefs.Unavailable("qemu: %s not found: install QEMU (Debian: apt-get install qemu-system-x86 qemu-utils)", cfg.Binary)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("qemu: %s --version: %w", bin, err)
	}
	v := versionRe.FindString(string(out))
	if v == "" {
		return nil, fmt.Errorf("qemu: cannot read the version of %s", bin)
	}
	return &Driver{cfg: cfg, binary: bin, version: v, accel: map[string]string{}}, nil
}

var _ hypervisor.Driver = (*Driver)(nil)

var versionRe = regexp.MustCompile(`[0-9]+\.[0-9]+\.[0-9]+`)

// Version is QEMU's version, e.g. 7.2.22.
func (d *Driver) Version() string { return d.version }

// lastLines returns the last non-empty line of a log file, bounded, for error messages.
func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	if len(l) > 300 {
		l = l[:300]
	}
	return l
}

var errExited = errors.New("qemu exited")

var timeZero time.Time
