package vmm

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"os"
	"runtime"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

// VMOverheadMiB is what one QEMU process takes beyond its guest's memory (device models, the
// TCG translation cache, page tables), as its cgroup allows it: counted with each sandbox when
// admitting another.
const VMOverheadMiB = qemu.MaxOverheadMiB

// DefaultMemoryShare is the part of host memory sandboxes may take together by default.
const DefaultMemoryShare = 0.9

// Admission is what this host can give sandboxes.
type Admission struct {
	// MemoryShare is the part (0–1] of host memory that running sandboxes, with their QEMU
	// overhead, may take together; default DefaultMemoryShare.
	MemoryShare float64
	// VCPUOvercommit lets one sandbox have more vCPUs than the host has cores.
	VCPUOvercommit bool
	// HostMemoryMiB and HostCores default to /proc/meminfo's MemTotal and the CPUs this
	// process may run on.
	HostMemoryMiB int
	HostCores     int
}

func (a Admission) withDefaults() Admission {
	if a.MemoryShare <= 0 || a.MemoryShare > 1 {
		a.MemoryShare = DefaultMemoryShare
	}
	if a.HostMemoryMiB == 0 {
		a.HostMemoryMiB = hostMemoryMiB()
	}
	if a.HostCores == 0 {
		a.HostCores = runtime.NumCPU()
	}
	return a
}

// admit reserves memMiB and vcpus for the boot of sandbox id, or refuses with a sentence that
// gives the numbers. The reservation holds until release; a booted VM is counted from s.vms
// meanwhile, so the overlap only ever overcounts.
func (s *Service) admit(id string, memMiB, vcpus int) (release func(), err error) {
	a := s.cfg.Admission
	if vcpus > a.HostCores && !a.VCPUOvercommit {
		return nil, errdefs.Refused("--vcpus %d is more than this host's %d cores: ask for at most %d, or start the stack with --vcpu-overcommit", vcpus, a.HostCores, a.HostCores)
	}
	limit := int(float64(a.HostMemoryMiB) * a.MemoryShare)
	s.mu.Lock()
	defer s.mu.Unlock()
	used, n := 0, 0
	for vid, m := range s.vms {
		if _, booting := s.reserved[vid]; !booting {
			used += m.vm.Spec().MemoryMiB + VMOverheadMiB
			n++
		}
	}
	for _, mib := range s.reserved {
		used += mib
		n++
	}
	want := memMiB + VMOverheadMiB
	if used+want > limit {
		return nil, errdefs.Refused("not enough host memory for a %d MiB sandbox: sandboxes may take %d MiB (%.0f%% of %d MiB) and %d sandboxes hold %d MiB of it (with %d MiB QEMU overhead each); stop one, ask for less --memory, or start the stack with a larger --memory-share",
			memMiB, limit, a.MemoryShare*100, a.HostMemoryMiB, n, used, VMOverheadMiB)
	}
	s.reserved[id] = want
	return func() {
		s.mu.Lock()
		delete(s.reserved, id)
		s.mu.Unlock()
	}, nil
}

// admitDisk refuses a boot whose new root disk of diskMiB and new volume images the home's free
// space could not hold once the guest filled them; disks and images that exist are not counted.
func (s *Service) admitDisk(id string, diskMiB int, vols []api.Volume) error {
	want := 0
	if _, err := os.Stat(diskFile(s.cfg.Home.Sandbox(id))); diskMiB > 0 && err != nil {
		want += diskMiB
	}
	for _, v := range vols {
		if _, err := os.Stat(s.volumePath(id, v.Name)); err != nil && volumeNameRe.MatchString(v.Name) {
			want += cmp.Or(v.SizeMiB, DefaultVolumeMiB)
		}
	}
	if want == 0 {
		return nil
	}
	sp, err := s.cfg.Home.Space()
	if err != nil {
		return err
	}
	return diskFits(s.cfg.Home.String(), sp, want)
}

// diskFits is the sentence refusing a diskMiB disk on a home with sp free, or nil.
func diskFits(dir string, sp home.Space, diskMiB int) error {
	if want := uint64(diskMiB) << 20; want > sp.Free {
		return errdefs.Refused("not enough free disk for %s of new disks: %s has %s free of %s; ask for less --disk or free space there",
			home.Bytes(want), dir, home.Bytes(sp.Free), home.Bytes(sp.Total))
	}
	return nil
}

// hostMemoryMiB is MemTotal from /proc/meminfo; 0 when it cannot be read (then nothing is
// admitted: a host we cannot measure gives nothing away).
func hostMemoryMiB() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var kib int
		if n, _ := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kib); n == 1 {
			return kib >> 10
		}
	}
	return 0
}
