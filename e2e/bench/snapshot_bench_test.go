package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// snapshotParent creates a nexus-mini sandbox, snapshots it as snap and removes both afterwards
// (forks first: a snapshot with live children cannot be removed).
func snapshotParent(b *testing.B, name, snap string) {
	b.Helper()
	sandbox(b, name)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := client.SnapshotCreate(ctx, api.SnapshotCreateRequest{Sandbox: name, Snapshot: snap}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		client.SnapshotRemove(ctx, snap)
	})
}

func forkSandbox(ctx context.Context, snap, name string) error {
	_, err := client.Fork(ctx, api.ForkRequest{Source: snap, Name: name, Labels: map[string]string{"nexus-test": "1"}})
	return err
}

// BenchmarkFork compares fork → first exec result with cold create → first exec result, same
// image and memory (goal: fork ≤ 0.2× cold).
func BenchmarkFork(b *testing.B) {
	ctx := context.Background()
	var cold, forked time.Duration
	b.Run("cold-create-to-first-exec", func(b *testing.B) {
		cold = createToFirstExec(b, "cold", "nexus-mini")
		b.ReportMetric(float64(cold.Milliseconds()), "ms/create")
	})
	b.Run("fork-to-first-exec", func(b *testing.B) {
		snapshotParent(b, "bench/fork-parent", "bench-fork")
		i := 0
		var total time.Duration
		for b.Loop() {
			name := fmt.Sprintf("bench/fork-%d", i)
			i++
			t0 := time.Now()
			cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			if err := forkSandbox(cctx, "bench-fork", name); err != nil {
				b.Fatal(err)
			}
			if err := exec(cctx, name, "true"); err != nil {
				b.Fatal(err)
			}
			total += time.Since(t0)
			cancel()
			b.StopTimer()
			remove(name)
			b.StartTimer()
		}
		forked = total / time.Duration(b.N)
		b.ReportMetric(float64(forked.Milliseconds()), "ms/fork")
		if cold > 0 {
			b.ReportMetric(float64(forked)/float64(cold), "x-cold")
		}
	})
}

// pss is a process's proportional set size from /proc/<pid>/smaps_rollup: pages shared with
// other processes count by their share.
func pss(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no Pss line for pid %d", pid)
}

// totalPSS sums the PSS of the QEMUs of the named sandboxes.
func totalPSS(b *testing.B, names map[string]bool) int64 {
	b.Helper()
	list, err := client.List(context.Background(), api.ListRequest{Selector: []string{"nexus-test"}})
	if err != nil {
		b.Fatal(err)
	}
	var sum int64
	n := 0
	for _, s := range list {
		if !names[s.Name] {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(string(stack.Home), "sandboxes", s.ID, "qemu.pid"))
		if err != nil {
			b.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
		p, err := pss(pid)
		if err != nil {
			b.Fatal(err)
		}
		sum += p
		n++
	}
	if n != len(names) {
		b.Fatalf("found %d of %d sandboxes", n, len(names))
	}
	return sum
}

// forkN is how many sandboxes BenchmarkForkMemory runs of each kind (NEXUS_BENCH_FORKS, default 10).
func forkN() int {
	if n, err := strconv.Atoi(os.Getenv("NEXUS_BENCH_FORKS")); err == nil && n > 0 {
		return n
	}
	return 10
}

// BenchmarkForkMemory is the host memory (sum of QEMU PSS) of N idle forks of one snapshot
// against N idle cold-booted sandboxes: forks share the snapshot's unmodified pages.
func BenchmarkForkMemory(b *testing.B) {
	ctx := context.Background()
	n := forkN()
	var forkPSS, coldPSS int64
	// Measured once, before the (empty) timed loop: 2N sandboxes is the expensive part, and
	// b.Loop would discard metrics reported before it.
	{
		snapshotParent(b, "bench/mem-parent", "bench-mem")
		forks := map[string]bool{}
		for i := range n {
			name := fmt.Sprintf("bench/mem-fork-%d", i)
			cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			if err := forkSandbox(cctx, "bench-mem", name); err != nil {
				b.Fatal(err)
			}
			cancel()
			forks[name] = true
			b.Cleanup(func() { remove(name) })
		}
		time.Sleep(3 * time.Second) // let the guests settle into idle: this is what is measured
		forkPSS = totalPSS(b, forks)
		for name := range forks {
			remove(name)
		}
		cold := map[string]bool{}
		for i := range n {
			name := fmt.Sprintf("bench/mem-cold-%d", i)
			cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			if _, err := client.Create(cctx, api.CreateRequest{Name: name, Image: "nexus-mini", MemoryMiB: 256, Labels: map[string]string{"nexus-test": "1"}}); err != nil {
				b.Fatal(err)
			}
			cancel()
			cold[name] = true
			b.Cleanup(func() { remove(name) })
		}
		time.Sleep(3 * time.Second)
		coldPSS = totalPSS(b, cold)
		for name := range cold {
			remove(name)
		}
	}
	for b.Loop() {
	}
	b.ReportMetric(float64(n), "sandboxes")
	b.ReportMetric(float64(forkPSS)/(1<<20), "MiB-pss-forks")
	b.ReportMetric(float64(coldPSS)/(1<<20), "MiB-pss-cold")
	b.ReportMetric(float64(forkPSS)/float64(coldPSS), "x-cold")
}

// BenchmarkPauseResume is the latency of pause and resume through the gateway, and how long a
// snapshot keeps the parent's vCPUs stopped.
func BenchmarkPauseResume(b *testing.B) {
	sandbox(b, "bench/pause")
	ctx := context.Background()
	apply := func(verb api.Lifecycle) time.Duration {
		t0 := time.Now()
		res, err := client.Apply(ctx, verb, api.NamesRequest{Names: []string{"bench/pause"}})
		if err != nil || len(res) != 1 || res[0].Error != "" {
			b.Fatalf("%s: %v %+v", verb.Verb, err, res)
		}
		return time.Since(t0)
	}
	var pause, resume []time.Duration
	for b.Loop() {
		pause = append(pause, apply(api.Pause))
		resume = append(resume, apply(api.Resume))
	}
	b.ReportMetric(percentile(pause, 0.5), "pause-p50-ms")
	b.ReportMetric(percentile(resume, 0.5), "resume-p50-ms")
	b.StopTimer()
	var stopped []float64
	for i := range 3 {
		snap := fmt.Sprintf("bench-pause-%d", i)
		s, err := client.SnapshotCreate(ctx, api.SnapshotCreateRequest{Sandbox: "bench/pause", Snapshot: snap})
		if err != nil {
			b.Fatal(err)
		}
		stopped = append(stopped, float64(s.PausedMillis))
		client.SnapshotRemove(ctx, snap)
	}
	var sum float64
	for _, v := range stopped {
		sum += v
	}
	b.ReportMetric(sum/float64(len(stopped)), "snapshot-paused-ms")
}
