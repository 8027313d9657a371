package hypervisor

import (
	"fmt"

	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

// Mount is a host directory shared into the guest over virtio-9p, or over virtiofs when Virtiofs
// is set.
type Mount struct {
	HostPath string
	Tag      string // mount tag; default nexus<N> by position
	ReadOnly bool
	// Virtiofs asks for the share to be served over virtiofs (a vhost-user daemon beside the
	// hypervisor) rather than 9p. A driver that cannot serve it so clears it: the Spec its VM
	// gives back says what the guest must mount.
	Virtiofs bool `json:",omitempty"`
	// Guest and Remount are recorded for snapshots (api.Mount.Remount); the driver does not use them.
	Guest   string `json:",omitempty"`
	Remount bool   `json:",omitempty"`
}

// MountTag is the tag of the i-th mount: nexus<i>.
func MountTag(i int) string { return fmt.Sprintf("nexus%d", i) }

// TagAt is m's tag when it is the i-th mount.
func (m Mount) TagAt(i int) string {
	if m.Tag != "" {
		return m.Tag
	}
	return MountTag(i)
}

// Disk is an extra virtio-blk disk (named volumes).
type Disk struct {
	Path     string
	Format   string // raw or qcow2; default raw
	ReadOnly bool
}

// GuestNet is the static network configuration handed to the agent on the kernel command line.
type GuestNet struct {
	IP      string // CIDR, e.g. 192.168.127.2/24
	Gateway string
	DNS     string
}

// Spec describes one microVM. A driver records it with the VM and gives it back from VM.Spec:
// snapshots describe the machine from it, and forks boot the same one.
type Spec struct {
	ID  string // sandbox id: [a-z0-9][a-z0-9-]{0,62}
	Dir string // sandbox directory: sockets, logs, pidfile

	Kernel        string // vmlinux (PVH, preferred) or bzImage
	KernelVersion string // accelerator-probe cache key; default: kernel file name and size
	Initrd        string
	Hostname      string    // default ID
	Net           *GuestNet // static IP config for the agent; nil: none
	Cmdline       []string  // extra kernel command-line tokens

	MemoryMiB int
	VCPUs     int
	// CPUs is the host CPU time the VM may use, in CPUs (fractional: 0.5 is half of one); 0:
	// VCPUs. The driver enforces it (QEMU: its cgroup's CPU quota).
	CPUs float64 `json:",omitempty"`
	// DiskBps and DiskIOPS bound the VM's disk reads and writes, each direction, its disks
	// together, per second; 0: the driver's defaults. The driver enforces them where the
	// guest's I/O starts (QEMU: a throttle group on its drives), so buffered writes the host
	// writes back later count too.
	DiskBps  int64 `json:",omitempty"`
	DiskIOPS int   `json:",omitempty"`

	Disk       string // root disk: qcow2 overlay over the read-only base image
	NetSocket  string // unix socket the hypervisor listens on for the user-mode network stack; empty: no NIC at all
	MAC        string // default MACFor(ID)
	Mounts     []Mount
	ExtraDisks []Disk
	// FreePageReporting gives the host back the RAM the guest frees (QEMU: a virtio-balloon
	// reporting free pages, which punches holes in the RAM file). Only for a VM that is never
	// saved: QEMU 7.2 punches the file even when it is mapped copy-on-write, so a VM restored
	// from a snapshot or template would zero pages its siblings map (ReportsFreePages).
	FreePageReporting bool `json:",omitempty"`

	// NetdevArgs (QEMU only), when set, replace the NIC's `-netdev stream…` arguments with other QEMU
	// arguments defining netdev id net0 (e.g. "-netdev", "user,id=net0"): benchmarks compare
	// the netstack with QEMU's own networking and passt this way. Sandboxes never set it.
	NetdevArgs []string

	// RAMPath is the memory-backend file; default /dev/shm/nexus-<id>-<hash of Dir>.ram.
	RAMPath string
	// Incoming restores a saved VM (Driver.Restore): RAMPath is a snapshot's RAM file, mapped
	// share=off (copy-on-write, never removed) and QEMU waits stopped for the device state.
	Incoming bool
}

// ReportsFreePages says whether a VM of these mounts may report its free pages: one with a mount
// that refuses snapshots and forks (a live mount that is not dropped and mounted again around
// a snapshot) is never saved, so its RAM file is its own.
func ReportsFreePages(mounts []Mount) bool {
	for _, m := range mounts {
		if !m.Remount || m.Guest == "" {
			return true
		}
	}
	return false
}

// MACFor is the MAC address a VM with this id gets when its spec names none (vmm.MACFor). A
// restored VM has the MAC of the VM it was saved from until its configure step gives it its own.
func MACFor(id string) string { return vmmapi.MACFor(id) }
