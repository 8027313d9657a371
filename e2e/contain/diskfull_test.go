package contain_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/internal/testutil"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

// create boots a nexus-mini sandbox and removes it when t ends. Its root disk is the least
// nexus-mini takes (its image is 514 MiB), not the default 8 GiB the small home could not hold.
func create(t *testing.T, name string, args ...string) {
	t.Helper()
	stack.MustNexus(t, append([]string{"create", name, "--image", "nexus-mini", "--memory", "256", "--disk", diskMiB}, args...)...)
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", name) })
}

// execOK runs echo in a sandbox and fails t unless it answers.
func execOK(t *testing.T, name string) {
	t.Helper()
	out, errOut, code := stack.Nexus(t, "exec", name, "--", "echo", "alive")
	if code != 0 || out != "alive\n" {
		t.Fatalf("exec in %s: exit %d, %q %q", name, code, out, errOut)
	}
}

// diskEvents collects the host's DiskEvents.
type diskEvents struct {
	mu  sync.Mutex
	evs []vmmapi.DiskEvent
}

func (d *diskEvents) last() (vmmapi.DiskEvent, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.evs) == 0 {
		return vmmapi.DiskEvent{}, false
	}
	return d.evs[len(d.evs)-1], true
}

// TestHostDiskFull: below the watermark a DiskEvent says the home is low and new sandboxes are
// refused with "host disk full" while running ones keep working; a guest that then fills the host
// disk gets the write errors itself (werror=report) instead of being paused; once space is freed
// every sandbox answers, none was stopped, and creates work again.
func TestHostDiskFull(t *testing.T) {
	nc, err := stack.Connect(bus.UserGateway)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var evs diskEvents
	sub, err := nc.Subscribe(vmmapi.DiskEventSubject(bus.LocalHost), func(m *nats.Msg) {
		var ev vmmapi.DiskEvent
		if json.Unmarshal(m.Data, &ev) == nil {
			evs.mu.Lock()
			evs.evs = append(evs.evs, ev)
			evs.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	create(t, "disk/quiet")
	create(t, "disk/filler")
	// Ballast takes the home below the watermark, leaving the filler little to fill.
	sp, err := stack.Home.Space()
	if err != nil {
		t.Fatal(err)
	}
	ballast := filepath.Join(stack.Home.String(), "ballast")
	f, err := os.Create(ballast)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(sp.Free)-40<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	defer os.Remove(ballast)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if ev, ok := evs.last(); !ok || !ev.Low || !strings.Contains(ev.Message, home.ErrDiskFull) {
			return fmt.Errorf("no low-disk event yet (%+v)", ev)
		}
		return nil
	})
	_, errOut, code := stack.Nexus(t, "create", "disk/refused", "--image", "nexus-mini", "--memory", "256")
	if code == 0 || !strings.Contains(errOut, "host disk full") {
		t.Fatalf("create below the watermark: exit %d, %q; want a refusal saying host disk full", code, errOut)
	}
	if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "disk/refused") {
		t.Fatalf("a refused create left a record:\n%s", out)
	}
	execOK(t, "disk/quiet")

	// The filler writes until a write fails: the home fills before the guest's own disk does.
	// The data is not zeroes, which the qcow2 driver would unmap (detect-zeroes) and not store.
	out, errOut, code := stack.Nexus(t, "exec", "disk/filler", "--", "sh", "-c", `
		tr '\000' x </dev/zero | head -c 1048576 >/b0
		for i in 1 2 3 4; do cat /b0 /b0 >/b1 && mv /b1 /b0; done
		i=0; while [ $i -lt 16 ]; do dd if=/b0 of=/fill bs=1M count=16 seek=$((i*16)) conv=notrunc,fsync 2>/dev/null || break; i=$((i+1)); done
		echo "stopped after $i blocks"`)
	t.Logf("filler: exit %d: %s %s", code, strings.TrimSpace(out), errOut)
	if code != 0 || !strings.Contains(out, "stopped after") || strings.Contains(out, "after 16 blocks") {
		t.Fatalf("the filler's writes should fail inside the guest: exit %d, %q %q", code, out, errOut)
	}
	// Free the space. On the old build QEMU paused the filler on ENOSPC and it stayed paused;
	// now both VMs answer, nothing was stopped, and creates are admitted again.
	os.Remove(ballast)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if ev, ok := evs.last(); !ok || ev.Low {
			return fmt.Errorf("no recovered-disk event yet (%+v)", ev)
		}
		return nil
	})
	execOK(t, "disk/quiet")
	execOK(t, "disk/filler")
	for _, n := range []string{"disk/quiet", "disk/filler"} {
		if st := state(t, n); st != "running" {
			t.Fatalf("%s is %s after the host disk was full, want running", n, st)
		}
	}
	create(t, "disk/after")
	execOK(t, "disk/after")
}

func state(t *testing.T, name string) string {
	t.Helper()
	out := stack.MustNexus(t, "ps", "-a", "--json")
	var list []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v: %s", err, out)
	}
	for _, s := range list {
		if s.Name == name {
			return s.State
		}
	}
	return "absent"
}
