package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/services/vmm/initramfs"
	"github.com/IniZio/nexus/services/vmm/kernel"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

// BenchmarkBoot compares a cold create → first exec result through the whole stack with a bare
// QEMU boot of the same kernel and initramfs to the agent's first line at /init (warm creates:
// warm_bench_test.go).
func BenchmarkBoot(b *testing.B) {
	ctx := context.Background()
	var bare, full time.Duration
	b.Run("bare-qemu-to-init", func(b *testing.B) {
		k, err := kernel.Ensure(ctx, testutil.CacheDir(), nil)
		if err != nil {
			b.Fatal(err)
		}
		bin, _ := testutil.Binaries()
		initrd, err := initramfs.Build(k, filepath.Join(bin, "nexus-agent"), initramfs.DefaultModules, filepath.Join(b.TempDir()))
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
		var total time.Duration
		for b.Loop() {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			dt, err := d.BootToMarker(cctx, qemu.BootSpec{Kernel: kern, Initrd: initrd, Accel: accel(), Marker: "booting", RAMFile: true,
				MemoryMiB: 256})
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			total += dt
		}
		bare = total / time.Duration(b.N)
		b.ReportMetric(float64(bare.Milliseconds()), "ms/boot")
	})
	b.Run("create-to-first-exec", func(b *testing.B) {
		full = createToFirstExec(b, "boot", "nexus-mini")
		b.ReportMetric(float64(full.Milliseconds()), "ms/boot")
		if bare > 0 {
			b.ReportMetric(float64(full)/float64(bare), "x-bare")
		}
	})
}

func accel() string {
	if v := os.Getenv("NEXUS_ACCEL"); v != "" {
		return v
	}
	return qemu.AccelTCG
}

// BenchmarkExecTrue is the exec round trip of `true` on a running sandbox through the bus.
func BenchmarkExecTrue(b *testing.B) {
	sandbox(b, "bench/exec")
	ctx := context.Background()
	exec(ctx, "bench/exec", "true") // warm
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := exec(ctx, "bench/exec", "true"); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.ReportMetric(percentile(lat, 0.5), "p50-ms")
	b.ReportMetric(percentile(lat, 0.99), "p99-ms")
}

// BenchmarkIdleMemory is the host memory one idle sandbox costs (QEMU's resident set).
func BenchmarkIdleMemory(b *testing.B) {
	sandbox(b, "bench/idle")
	var rss int64
	for b.Loop() {
		time.Sleep(2 * time.Second) // let the guest settle into idle: this is what is measured
		list, err := client.List(context.Background(), api.ListRequest{Selector: []string{"nexus-test"}})
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range list {
			if s.Name == "bench/idle" {
				rss = s.RSSBytes
			}
		}
	}
	b.ReportMetric(float64(rss)/(1<<20), "MiB-rss")
}

// BenchmarkCreate10 creates ten sandboxes at once, cold, and compares the wall time with ten
// times one cold create measured just before.
func BenchmarkCreate10(b *testing.B) {
	ctx := context.Background()
	one := func(name string) time.Duration {
		t0 := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		if _, err := client.Create(cctx, api.CreateRequest{Name: name, Image: "nexus-mini", MemoryMiB: 128, Cold: true, Labels: map[string]string{"nexus-test": "1"}}); err != nil {
			b.Error(err)
		}
		return time.Since(t0)
	}
	for b.Loop() {
		single := one("bench/single")
		remove("bench/single")
		t0 := time.Now()
		var wg sync.WaitGroup
		for i := range 10 {
			wg.Go(func() { one(fmt.Sprintf("bench/par-%d", i)) })
		}
		wg.Wait()
		wall := time.Since(t0)
		for i := range 10 {
			remove(fmt.Sprintf("bench/par-%d", i))
		}
		b.ReportMetric(float64(wall.Milliseconds()), "ms-wall-10")
		b.ReportMetric(float64(single.Milliseconds()), "ms-one")
		b.ReportMetric(float64(wall)/float64(10*single), "x-10-serial")
	}
}
