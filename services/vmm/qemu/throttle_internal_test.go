package qemu

import (
	"strings"
	"testing"
	"time"
)

// TestDisksThrottled: every drive of a VM joins one QEMU throttle group bounding each direction's
// bytes and operations per second, the Spec's own limits or else the driver's; its cgroup gets
// the same.
func TestDisksThrottled(t *testing.T) {
	d := &Driver{cfg: Config{DiskBps: defaultDiskBps, DiskIOPS: defaultDiskIOPS}}
	for _, c := range []struct {
		bps  int64
		iops int
		want string
	}{
		{0, 0, ",throttling.bps-read=268435456,throttling.bps-write=268435456,throttling.iops-read=8192,throttling.iops-write=8192,throttling.group=io"},
		{8 << 20, 100, ",throttling.bps-read=8388608,throttling.bps-write=8388608,throttling.iops-read=100,throttling.iops-write=100,throttling.group=io"},
	} {
		s := VMSpec{ID: "a", Dir: "/tmp/x", Kernel: "/k", Initrd: "/i", MemoryMiB: 256, VCPUs: 1, Disk: "/tmp/x/disk.qcow2",
			ExtraDisks: []Disk{{Path: "/tmp/x/v.img"}}, DiskBps: c.bps, DiskIOPS: c.iops}
		d.diskDefaults(&s)
		args := commandLine(&s, AccelTCG, "/dev/shm/r", time.Unix(0, 0))
		n := 0
		for i, a := range args {
			if a == "-drive" {
				n++
				if !strings.HasSuffix(args[i+1], c.want) {
					t.Errorf("drive %s, want it to end %s", args[i+1], c.want)
				}
			}
		}
		if n != 2 {
			t.Fatalf("%d drives, want 2: %v", n, args)
		}
		l := d.limitsFor(&s, AccelTCG)
		if l.bps != uint64(s.DiskBps) || l.iops != uint64(s.DiskIOPS) || s.DiskBps <= 0 {
			t.Errorf("cgroup limits %d B/s %d IOPS, spec %d %d", l.bps, l.iops, s.DiskBps, s.DiskIOPS)
		}
	}
}
