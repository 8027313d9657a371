package kernel_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/internal/vmtest"
	"github.com/IniZio/nexus/services/vmm/kernel"
)

func needApt(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"apt-get", "dpkg-deb", "depmod"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

// TestEnsureCached: once the shared cache holds the kernel, Ensure reports no step at all
// (no download, no unpack) and answers fast.
func TestEnsureCached(t *testing.T) {
	needApt(t)
	k := vmtest.Kernel(t)
	var steps []string
	start := time.Now()
	k2, err := kernel.Ensure(context.Background(), testutil.CacheDir(), func(s string, _ float64) { steps = append(steps, s) })
	if err != nil {
		t.Fatal(err)
	}
	if dt := time.Since(start); dt > 200*time.Millisecond {
		t.Errorf("cached Ensure took %v", dt)
	}
	if len(steps) != 0 {
		t.Errorf("cached Ensure did work: %v", steps)
	}
	if *k2 != *k || !strings.HasPrefix(k.Version, "6.") || k.VmlinuxPath == "" {
		t.Errorf("kernel = %+v", k2)
	}
}

// TestEnsureFreshConcurrent fetches into an empty cache from two goroutines at once: the flock
// makes one fetch and the other reuse it.
func TestEnsureFreshConcurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("downloads and unpacks a 70 MB kernel package")
	}
	needApt(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var mu sync.Mutex
	downloads := 0
	progress := func(s string, _ float64) {
		if strings.HasPrefix(s, "download "+kernel.MetaPackage) {
			mu.Lock()
			downloads++
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	ks := make([]*kernel.Kernel, 2)
	errs := make([]error, 2)
	start := time.Now()
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); ks[i], errs[i] = kernel.Ensure(ctx, dir, progress) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("fresh fetch+unpack+depmod: %v", time.Since(start))
	if downloads != 1 {
		t.Errorf("downloaded %d times", downloads)
	}
	if *ks[0] != *ks[1] {
		t.Errorf("different results: %+v %+v", ks[0], ks[1])
	}
}

func TestEnsureWithoutApt(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := kernel.Ensure(context.Background(), t.TempDir(), nil)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "apt-get") {
		t.Fatalf("err = %v, want unavailable naming apt-get", err)
	}
}

func TestResolve(t *testing.T) {
	needApt(t)
	k := vmtest.Kernel(t)
	mods, err := k.Resolve([]string{"virtio_net", "9p", "9pnet_virtio", "ext4", "af_packet", "crc32c-intel"})
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range mods {
		if _, dup := pos[m.Name]; dup {
			t.Errorf("%s listed twice", m.Name)
		}
		pos[m.Name] = i
	}
	for _, dep := range [][2]string{
		{"virtio_ring", "virtio_net"}, {"virtio", "virtio_net"}, {"failover", "net_failover"}, {"net_failover", "virtio_net"},
		{"netfs", "9p"}, {"fscache", "9p"}, {"9pnet", "9pnet_virtio"}, {"jbd2", "ext4"}, {"mbcache", "ext4"}, {"crc16", "ext4"},
	} {
		a, okA := pos[dep[0]]
		b, okB := pos[dep[1]]
		if !okA || !okB || a > b {
			t.Errorf("%s must load before %s: %v", dep[0], dep[1], mods)
		}
	}
	if _, ok := pos["af_packet"]; ok {
		t.Errorf("af_packet is built in and must be skipped")
	}
	if _, ok := pos["crc32c_intel"]; !ok {
		t.Errorf("crc32c-intel not resolved by its dashed name")
	}
	if _, err := k.Resolve([]string{"no_such_module"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown module: %v", err)
	}
}
