package vmm

import (
	"testing"

	api "github.com/IniZio/nexus/pkg/api/vmm"
)

// A fork's VM is contained like its parent's: the fork request's CPU quota and disk limits (the
// parent's, from the gateway) reach the machine it boots, not the defaults.
func TestForkBootKeepsContainment(t *testing.T) {
	s := &Service{}
	b := s.newForkBoot(api.ForkRequest{ID: "sb-1", Name: "p/child", CPUs: 0.5, DiskBps: 1 << 20, DiskIOPS: 100},
		api.SnapshotInfo{Name: "snap", MemoryMiB: 256, VCPUs: 2}, t.TempDir())
	if b.cpus != 0.5 || b.diskBps != 1<<20 || b.diskIOPS != 100 || b.vcpus != 2 || b.memoryMiB != 256 {
		t.Errorf("fork boot: cpus %g, disk bps %d, iops %d, vcpus %d, memory %d; want 0.5, 1048576, 100, 2, 256",
			b.cpus, b.diskBps, b.diskIOPS, b.vcpus, b.memoryMiB)
	}
}
