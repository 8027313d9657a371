package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/stream"
)

// Warm start (issue 24): creates restored from a booted template against cold boots of the same
// image and size, measured in one run: create → first exec, ten creates at once, and the PSS of
// ten idle sandboxes.

// warmTemplate builds the template of nexus-mini at memMiB with a NIC (the benchmarks' shape).
func warmTemplate(b *testing.B, memMiB int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := client.Image(ctx, vmmapi.ImageRequest{Op: "warm", Name: "nexus-mini", Warm: &vmmapi.TemplateShape{MemoryMiB: memMiB, VCPUs: 1, Net: true}}); err != nil {
		b.Fatal(err)
	}
}

// createTimed creates a nexus-mini sandbox and runs its first command; it returns how long that took.
func createTimed(b *testing.B, name string, memMiB int, cold, firstExec bool) time.Duration {
	return createProfiled(b, name, memMiB, cold, firstExec, nil)
}

// createProfiled is createTimed adding, when p is set, what each part of the create took.
func createProfiled(b *testing.B, name string, memMiB int, cold, firstExec bool, p *createProfile) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req := api.CreateRequest{Name: name, Image: "nexus-mini", MemoryMiB: memMiB, Cold: cold, Labels: map[string]string{"nexus-test": "1"}}
	var steps chan vmmapi.Step
	if p != nil {
		req.Progress = stream.NewID()
		steps = make(chan vmmapi.Step, 32)
		sub, err := client.Conn().Subscribe(stream.AnyHostOut(req.Progress), func(m *nats.Msg) {
			var st vmmapi.Step
			if json.Unmarshal(m.Data, &st) == nil && st.Name != "" {
				steps <- st
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Unsubscribe()
		client.Conn().Flush()
	}
	t0 := time.Now()
	if _, err := client.Create(ctx, req); err != nil {
		b.Error(err)
		return 0
	}
	created := time.Since(t0)
	if firstExec {
		if err := exec(ctx, name, "true"); err != nil {
			b.Error(err)
		}
	}
	took := time.Since(t0)
	if p != nil {
		client.Conn().Flush()
		p.add("create", created)
		p.add("first-exec", took-created)
		var vmm time.Duration
		for len(steps) > 0 {
			st := <-steps
			d := time.Duration(st.Millis) * time.Millisecond
			vmm += d
			p.add("step-"+st.Name, d)
		}
		p.add("gateway", created-vmm) // the create beyond the vmm's boot steps
		p.n++
	}
	return took
}

// createProfile sums what the parts of a series of creates took.
type createProfile struct {
	n     int
	parts map[string]time.Duration
}

func (p *createProfile) add(part string, d time.Duration) {
	if p.parts == nil {
		p.parts = map[string]time.Duration{}
	}
	p.parts[part] += d
}

// report reports each part's mean as ms-<prefix>-<part>.
func (p *createProfile) report(b *testing.B, prefix string) {
	for part, d := range p.parts {
		if p.n > 0 {
			b.ReportMetric(float64((d / time.Duration(p.n)).Milliseconds()), "ms-"+prefix+"-"+part)
		}
	}
}

// BenchmarkWarmCreate is create → first exec result restored from the template vs a cold boot,
// with where each one's time went: the vmm's boot steps, the rest of the create (the gateway:
// records, netstack, perimeter) and the first exec.
func BenchmarkWarmCreate(b *testing.B) {
	warmTemplate(b, 256)
	i := 0
	var cold, warm time.Duration
	var coldParts, warmParts createProfile
	for b.Loop() {
		for _, c := range []bool{true, false} {
			name := fmt.Sprintf("bench/warm-%d", i)
			i++
			p := &warmParts
			if c {
				p = &coldParts
			}
			d := createProfiled(b, name, 256, c, true, p)
			b.StopTimer()
			remove(name)
			b.StartTimer()
			if c {
				cold += d
			} else {
				warm += d
			}
		}
	}
	n := time.Duration(b.N)
	b.ReportMetric(float64((cold / n).Milliseconds()), "ms-cold")
	b.ReportMetric(float64((warm / n).Milliseconds()), "ms-warm")
	b.ReportMetric(float64(warm)/float64(cold), "x-cold")
	coldParts.report(b, "cold")
	warmParts.report(b, "warm")
}

// createParallel creates n sandboxes at once and returns the wall time.
func createParallel(b *testing.B, prefix string, n, memMiB int, cold bool) time.Duration {
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { createTimed(b, fmt.Sprintf("%s-%d", prefix, i), memMiB, cold, false) })
	}
	wg.Wait()
	return time.Since(t0)
}

func removeAll(prefix string, n int) {
	for i := range n {
		remove(fmt.Sprintf("%s-%d", prefix, i))
	}
}

// BenchmarkWarmParallel10 is the wall time of ten warm creates at once vs ten cold ones.
func BenchmarkWarmParallel10(b *testing.B) {
	warmTemplate(b, 128)
	for b.Loop() {
		cold := createParallel(b, "bench/c10", 10, 128, true)
		removeAll("bench/c10", 10)
		warm := createParallel(b, "bench/w10", 10, 128, false)
		removeAll("bench/w10", 10)
		b.ReportMetric(float64(cold.Milliseconds()), "ms-cold-10")
		b.ReportMetric(float64(warm.Milliseconds()), "ms-warm-10")
		b.ReportMetric(float64(warm)/float64(cold), "x-cold")
	}
}

// BenchmarkIdlePSS10 is the sum of the proportional set sizes of ten idle sandboxes' QEMUs,
// created warm (sharing the template's RAM pages copy-on-write) vs created cold.
func BenchmarkIdlePSS10(b *testing.B) {
	warmTemplate(b, 128)
	for b.Loop() {
		createParallel(b, "bench/pc", 10, 128, true)
		cold := idlePSS(b, "bench/pc", 10)
		removeAll("bench/pc", 10)
		createParallel(b, "bench/pw", 10, 128, false)
		warm := idlePSS(b, "bench/pw", 10)
		removeAll("bench/pw", 10)
		b.ReportMetric(float64(cold)/(1<<20), "MiB-pss-cold-10")
		b.ReportMetric(float64(warm)/(1<<20), "MiB-pss-warm-10")
		if cold > 0 {
			b.ReportMetric(float64(warm)/float64(cold), "x-cold")
		}
	}
}

// idlePSS lets the sandboxes settle and sums their QEMU processes' Pss (smaps_rollup).
func idlePSS(b *testing.B, prefix string, n int) int64 {
	b.Helper()
	time.Sleep(3 * time.Second) // idle is what is measured
	list, err := client.List(context.Background(), api.ListRequest{Selector: []string{"nexus-test"}})
	if err != nil {
		b.Fatal(err)
	}
	var sum int64
	found := 0
	for _, s := range list {
		if !strings.HasPrefix(s.Name, prefix+"-") {
			continue
		}
		pid, err := os.ReadFile(filepath.Join(stack.Home.Sandbox(s.ID), "qemu.pid"))
		if err != nil {
			b.Fatal(err)
		}
		kib, err := pssKiB(strings.TrimSpace(string(pid)))
		if err != nil {
			b.Fatal(err)
		}
		sum += kib << 10
		found++
	}
	if found != n {
		b.Fatalf("%d of %d sandboxes %s-* found", found, n, prefix)
	}
	return sum
}

func pssKiB(pid string) (int64, error) {
	f, err := os.Open("/proc/" + pid + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "Pss:" {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("no Pss in /proc/%s/smaps_rollup", pid)
}
