package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/services/vmm/initramfs"
	"github.com/IniZio/nexus/services/vmm/kernel"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

// The idle CPU figure: how long the guests settle before, and are measured over, one window.
const (
	idleGuests = 3
	idleSettle = 5 * time.Second
	idleWindow = 30 * time.Second
)

// BenchmarkIdleCPU is the host CPU an idle sandbox costs: idleGuests nexus-mini sandboxes
// (created warm, the default) against as many bare QEMUs of the same kernel, command line and
// memory whose init only sleeps, all idle at once and measured over the same window (QEMU's
// utime+stime), in cores per guest.
func BenchmarkIdleCPU(b *testing.B) {
	const memMiB = 256
	ctx := context.Background()
	k, err := kernel.Ensure(ctx, testutil.CacheDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	initrd, err := initramfs.BuildSleeper(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	d, err := qemu.New(qemu.Config{Accel: qemu.AccelTCG, CacheDir: testutil.CacheDir()})
	if err != nil {
		b.Fatal(err)
	}
	kern := k.VmlinuxPath
	if kern == "" {
		kern = k.VmlinuzPath
	}
	var bare []int
	for range idleGuests {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		vm, err := d.StartBare(cctx, qemu.BootSpec{Kernel: kern, Initrd: initrd, Accel: accel(), Marker: initramfs.SleepMarker,
			RAMFile: true, MemoryMiB: memMiB})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(vm.Stop)
		bare = append(bare, vm.Pid)
	}
	warmTemplate(b, memMiB)
	createParallel(b, "bench/idlecpu", idleGuests, memMiB, false)
	b.Cleanup(func() { removeAll("bench/idlecpu", idleGuests) })
	sandboxes := sandboxPids(b, "bench/idlecpu", idleGuests)
	for b.Loop() {
		time.Sleep(idleSettle) // idle is what is measured: the creates' work done
		bare0, sb0 := cpuOf(b, bare), cpuOf(b, sandboxes)
		t0 := time.Now()
		time.Sleep(idleWindow)
		bare1, sb1 := cpuOf(b, bare), cpuOf(b, sandboxes)
		dt := time.Since(t0).Seconds()
		bareCore := (bare1 - bare0) / dt / idleGuests
		sbCore := (sb1 - sb0) / dt / idleGuests
		b.ReportMetric(bareCore, "core-bare")
		b.ReportMetric(sbCore, "core-sandbox")
		if bareCore > 0 {
			b.ReportMetric(sbCore/bareCore, "x-bare")
		}
	}
}

// sandboxPids are the QEMU pids of the n sandboxes prefix-0 … prefix-(n-1).
func sandboxPids(b *testing.B, prefix string, n int) []int {
	var pids []int
	for i := range n {
		pids = append(pids, qemuPid(b, fmt.Sprintf("%s-%d", prefix, i)))
	}
	return pids
}

// cpuOf sums cpuSeconds over pids; a process gone fails the benchmark.
func cpuOf(b *testing.B, pids []int) float64 {
	var sum float64
	for _, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			b.Fatalf("qemu %d is gone: %v", pid, err)
		}
		sum += cpuSeconds(pid)
	}
	return sum
}
