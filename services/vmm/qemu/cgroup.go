package qemu

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Each QEMU runs in a cgroup of its own (issue 19), made with github.com/containerd/cgroups/v3:
// memory (guest RAM plus QEMU's overhead, no swap beyond it), a CPU quota from Spec.CPUs, a pids
// limit, and block I/O throttles on the device holding the sandbox directory. A controller is
// taken from the unified (v2) hierarchy when it offers it, else from its v1 hierarchy: hosts
// mount v1 controllers beside an empty v2 hierarchy, as this one does. The cgroup is a child of
// the vmm's own (so a vmm confined by its parent keeps its VMs inside), its directories are
// recorded in vm.json so a restarted vmm finds and removes them, and it is removed once QEMU has
// exited. A host where no controller is usable runs QEMU without one.
//
// Each VM's group sits directly in the vmm's group, named nexus-vm-<id>-<hash>, not in a group
// of all VMs: the CPU scheduler shares a group's time among its children, so one group of all
// VMs made them weigh together as much as one process of the host, and a quiet VM beside a busy
// one got half of that share on a loaded host (its exec p50 3-6x slower, measured; 1-2x as
// siblings, where the busy VM is one more process among the host's). Builds before kept VMs in
// <group>/nexus-vms/, which a VM they started keeps (its vm.json names the directories).

// cgroupRoot is where v1 hierarchies and the v2 one are looked for (a variable for the tests of
// the v2 limits, which this host's v1 controllers cannot run for real).
var cgroupRoot = "/sys/fs/cgroup"

// Memory QEMU needs beyond the guest's RAM, measured here with QEMU 7.2 (nexus-mini, 256 MiB
// guest, boot plus a busy exec: see TestCgroupLimits). Under TCG most of it is the translated
// code cache, bounded by -accel tcg,tb-size=tcgCacheMiB.
const (
	tcgCacheMiB     = 128
	overheadTCGMiB  = 96 + tcgCacheMiB
	overheadKVMMiB  = 96
	cgroupPidsMax   = 512         // QEMU's threads (vCPUs, I/O workers, RCU, 9p) with room to spare
	cpuPeriodUS     = 100_000     // the CFS period the quota is a share of
	defaultDiskBps  = 256 << 20   // per direction, on the sandbox directory's device
	defaultDiskIOPS = 8192        // per direction
	cgroupPrefix    = "nexus-vm-" // a VM's group is <the vmm's group>/nexus-vm-<id>-<hash>
	legacyVMsGroup  = "nexus-vms" // builds before made them <the vmm's group>/nexus-vms/<id>-<hash>
)

// MaxOverheadMiB is the most memory one QEMU takes beyond its guest's (the TCG figure): what
// admission counts per sandbox, so that what it admits fits the cgroup limits it will get.
const MaxOverheadMiB = overheadTCGMiB

// vmCgroup is the record of a VM's cgroup in vm.json.
type vmCgroup struct {
	// Dirs is each controller's directory: "memory", "cpu", "pids", "io" (blkio on v1).
	Dirs map[string]string `json:"dirs"`
	// V2 says which controllers are on the unified hierarchy (their Dirs are one directory).
	V2        []string `json:"v2,omitempty"`
	MemoryMiB int      `json:"memory_mib"` // the memory limit, for "out of memory (limit N MiB)"
}

// cgroupLimits are what a VM's cgroup allows.
type cgroupLimits struct {
	memoryMiB int
	cpuQuota  int64 // microseconds per cpuPeriodUS
	pids      int64
	dev       *[2]int64 // major, minor of the disk device; nil: not throttled (tmpfs, overlay)
	bps, iops uint64
}

// diskDefaults gives spec the driver's disk I/O limits where it asks for none.
func (d *Driver) diskDefaults(spec *VMSpec) {
	if spec.DiskBps <= 0 {
		spec.DiskBps = int64(d.cfg.DiskBps)
	}
	if spec.DiskIOPS <= 0 {
		spec.DiskIOPS = int(d.cfg.DiskIOPS)
	}
}

// limitsFor is the cgroup of spec under accel (its disk limits filled in by diskDefaults).
func (d *Driver) limitsFor(spec *VMSpec, accel string) cgroupLimits {
	over := overheadKVMMiB
	if accel == AccelTCG {
		over = overheadTCGMiB
	}
	cpus := spec.CPUs
	if cpus <= 0 {
		cpus = float64(spec.VCPUs)
	}
	l := cgroupLimits{memoryMiB: spec.MemoryMiB + over, cpuQuota: int64(cpus * cpuPeriodUS), pids: cgroupPidsMax,
		bps: uint64(spec.DiskBps), iops: uint64(spec.DiskIOPS)}
	if l.cpuQuota < 1000 {
		l.cpuQuota = 1000 // the kernel's least quota
	}
	var st unix.Stat_t
	if unix.Stat(spec.Dir, &st) == nil && unix.Major(st.Dev) != 0 {
		l.dev = &[2]int64{int64(unix.Major(st.Dev)), int64(unix.Minor(st.Dev))}
	}
	return l
}

// ioMax is the v2 io.max lines of l: each direction's bytes and operations per second on the
// disk's device.
func (l cgroupLimits) ioMax() []cgroup2.Entry {
	var out []cgroup2.Entry
	if l.dev == nil {
		return nil
	}
	for _, t := range []struct {
		typ  cgroup2.IOType
		rate uint64
	}{{cgroup2.ReadBPS, l.bps}, {cgroup2.WriteBPS, l.bps}, {cgroup2.ReadIOPS, l.iops}, {cgroup2.WriteIOPS, l.iops}} {
		if t.rate > 0 {
			out = append(out, cgroup2.Entry{Type: t.typ, Major: l.dev[0], Minor: l.dev[1], Rate: t.rate})
		}
	}
	return out
}

// cgroupName is the VM's cgroup name: its id and a hash of its directory (two homes, as tests
// run them, may use one id).
func cgroupName(id, dir string) string {
	h := sha256.Sum256([]byte(dir))
	return cgroupPrefix + id + "-" + hex.EncodeToString(h[:4])
}

// controllers says which hierarchy each controller is usable on: "v2", "v1" or absent.
func controllers() (map[string]string, string) {
	out := map[string]string{}
	v2 := ""
	for _, m := range []string{cgroupRoot, filepath.Join(cgroupRoot, "unified")} {
		if b, err := os.ReadFile(filepath.Join(m, "cgroup.controllers")); err == nil {
			v2 = m
			for _, c := range strings.Fields(string(b)) {
				out[c] = "v2"
			}
			break
		}
	}
	for c, v1 := range map[string]string{"memory": "memory", "cpu": "cpu", "pids": "pids", "io": "blkio"} {
		if out[c] == "" {
			if _, err := os.Stat(filepath.Join(cgroupRoot, v1, "cgroup.procs")); err == nil {
				out[c] = "v1"
			}
		}
	}
	for c := range out {
		switch c {
		case "memory", "cpu", "pids", "io":
		default:
			delete(out, c)
		}
	}
	return out, v2
}

// newCgroup makes the VM's cgroup with limits l and returns its record; nil (and why) when no
// controller is usable here.
func newCgroup(name string, l cgroupLimits) (*vmCgroup, error) {
	ctl, v2mount := controllers()
	if len(ctl) == 0 {
		return nil, errors.New("no cgroup controller is usable")
	}
	cg := &vmCgroup{Dirs: map[string]string{}, MemoryMiB: l.memoryMiB}
	mem := int64(l.memoryMiB) << 20
	period := uint64(cpuPeriodUS)
	var v1subs []cgroup1.Subsystem
	var v2res cgroup2.Resources
	v1res := &specs.LinuxResources{}
	for c, h := range ctl {
		if h == "v2" {
			cg.V2 = append(cg.V2, c)
		}
		switch c {
		case "memory":
			if h == "v2" {
				swap := int64(0)
				v2res.Memory = &cgroup2.Memory{Max: &mem, Swap: &swap}
			} else {
				v1subs = append(v1subs, cgroup1.NewMemory(cgroupRoot, cgroup1.OptionalSwap()))
				v1res.Memory = &specs.LinuxMemory{Limit: &mem, Swap: &mem}
			}
		case "cpu":
			if h == "v2" {
				v2res.CPU = &cgroup2.CPU{Max: cgroup2.NewCPUMax(&l.cpuQuota, &period)}
			} else {
				v1subs = append(v1subs, cgroup1.NewCpu(cgroupRoot))
				v1res.CPU = &specs.LinuxCPU{Quota: &l.cpuQuota, Period: &period}
			}
		case "pids":
			if h == "v2" {
				v2res.Pids = &cgroup2.Pids{Max: l.pids}
			} else {
				v1subs = append(v1subs, cgroup1.NewPids(cgroupRoot))
				v1res.Pids = &specs.LinuxPids{Limit: &l.pids}
			}
		case "io":
			if h == "v2" {
				v2res.IO = &cgroup2.IO{Max: l.ioMax()}
			} else {
				v1subs = append(v1subs, cgroup1.NewBlkio(cgroupRoot))
				bio := &specs.LinuxBlockIO{}
				if l.dev != nil {
					dev := func(rate uint64) []specs.LinuxThrottleDevice {
						if rate == 0 {
							return nil
						}
						td := specs.LinuxThrottleDevice{Rate: rate}
						td.Major, td.Minor = l.dev[0], l.dev[1]
						return []specs.LinuxThrottleDevice{td}
					}
					bio.ThrottleReadBpsDevice, bio.ThrottleWriteBpsDevice = dev(l.bps), dev(l.bps)
					bio.ThrottleReadIOPSDevice, bio.ThrottleWriteIOPSDevice = dev(l.iops), dev(l.iops)
				}
				v1res.BlockIO = bio
			}
		}
	}
	if len(cg.V2) > 0 {
		parent, err := vmsV2Parent(v2mount)
		if err == nil {
			group := filepath.Join(parent, name)
			_, err = cgroup2.NewManager(v2mount, group, &v2res)
			for _, c := range cg.V2 {
				cg.Dirs[c] = filepath.Join(v2mount, group)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("cgroup v2: %w", err)
		}
	}
	if len(v1subs) > 0 {
		path := cgroup1.NestedPath(name)
		if _, err := cgroup1.New(path, v1res, cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return v1subs, nil })); err != nil {
			cg.remove()
			return nil, fmt.Errorf("cgroup v1: %w", err)
		}
		for _, s := range v1subs {
			p, err := path(s.Name())
			if err != nil {
				cg.remove()
				return nil, fmt.Errorf("cgroup v1 %s: %w", s.Name(), err)
			}
			c := string(s.Name())
			if c == "blkio" {
				c = "io"
			}
			cg.Dirs[c] = filepath.Join(cgroupRoot, string(s.Name()), p)
		}
	}
	return cg, nil
}

// vmmLeaf is the group the vmm moves itself into, on the unified hierarchy, when the group it
// was started in holds processes (a systemd service's, say): v2 lets a group that holds
// processes hand no controller to its children, so the vmm leaves its group to the VMs' parent.
const vmmLeaf = "nexus-vmm"

// vmsV2Parent is the unified hierarchy's group the VMs' groups are made in, the vmm's group,
// once that holds no process of its own (the root group may).
func vmsV2Parent(mount string) (string, error) {
	own, err := ownV2Group()
	if err != nil {
		return "", err
	}
	switch {
	case filepath.Base(own) == vmmLeaf:
		own = filepath.Dir(own) // moved already
	case own != "/":
		procs, err := os.ReadFile(filepath.Join(mount, own, "cgroup.procs"))
		if err != nil || len(strings.TrimSpace(string(procs))) == 0 {
			break
		}
		leaf := filepath.Join(mount, own, vmmLeaf)
		if err := os.MkdirAll(leaf, 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return "", fmt.Errorf("move the vmm into %s, to leave %s to its VMs: %w", leaf, own, err)
		}
	}
	return own, nil
}

// selfCgroup is where this process's groups are read (a variable for the tests).
var selfCgroup = "/proc/self/cgroup"

// ownV2Group is this process's group on the unified hierarchy.
func ownV2Group() (string, error) {
	b, err := os.ReadFile(selfCgroup)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("not on a cgroup v2 hierarchy")
}

// add moves pid into every directory of the cgroup.
func (cg *vmCgroup) add(pid int) error {
	seen := map[string]bool{}
	for _, dir := range cg.Dirs {
		if seen[dir] {
			continue
		}
		seen[dir] = true
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("join cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// holds says whether pid is in the cgroup's memory (or any) directory, read from /proc: what a
// restarted vmm checks before it trusts the record.
func (cg *vmCgroup) holds(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	for _, dir := range cg.Dirs {
		for _, l := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(l, ":", 3)
			if len(parts) == 3 && parts[2] != "/" && strings.HasSuffix(dir, parts[2]) && strings.HasPrefix(dir, cgroupRoot+"/") {
				return true
			}
		}
	}
	return false
}

// removeIfAny removes the cgroup if there is one.
func (cg *vmCgroup) removeIfAny() error {
	if cg == nil {
		return nil
	}
	return cg.remove()
}

// remove deletes the cgroup's directories; they must be empty (QEMU exited).
func (cg *vmCgroup) remove() error {
	var errs []error
	for _, dir := range cg.Dirs {
		if !strings.HasPrefix(dir, cgroupRoot+"/") || !(strings.HasPrefix(filepath.Base(dir), cgroupPrefix) ||
			strings.Contains(dir, "/"+legacyVMsGroup+"/")) {
			continue // never a directory a vm.json could point anywhere else
		}
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// oomKills is how many processes the kernel killed for the cgroup's memory limit.
func (cg *vmCgroup) oomKills() int {
	dir, ok := cg.Dirs["memory"]
	if !ok {
		return 0
	}
	file := "memory.oom_control" // v1
	if slices.Contains(cg.V2, "memory") {
		file = "memory.events"
	}
	f, err := os.Open(filepath.Join(dir, file))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// oomReason is "out of memory (limit N MiB)" once the kernel killed QEMU for its limit.
func (vm *VM) oomReason() string {
	if vm.cg == nil || vm.cg.oomKills() == 0 {
		return ""
	}
	return fmt.Sprintf("out of memory (limit %d MiB)", vm.cg.memoryLimitMiB())
}

// memoryLimitMiB is the memory limit in force (an operator may have changed it), else the one set.
func (cg *vmCgroup) memoryLimitMiB() int {
	file := "memory.limit_in_bytes"
	if slices.Contains(cg.V2, "memory") {
		file = "memory.max"
	}
	b, err := os.ReadFile(filepath.Join(cg.Dirs["memory"], file))
	if n, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && perr == nil && n > 0 {
		return int(n >> 20)
	}
	return cg.MemoryMiB
}

// Cgroup is the VM's cgroup directories by controller (memory, cpu, pids, io); nil without one.
func (vm *VM) Cgroup() map[string]string {
	if vm.cg == nil {
		return nil
	}
	return vm.cg.Dirs
}
