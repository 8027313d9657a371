package vmm_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// --disk sizes the root disk: the guest's root file system grows to it (df), the record and
// nexus stats carry it, and a disk the host's free space could not hold is refused with the
// numbers before anything boots. A named volume has the size= asked for. The same guest reports
// the memory it uses.
func TestDiskSizeAndGuestMemory(t *testing.T) {
	_, errOut, code := stack.Nexus(t, "create", "disk/huge", "--image", "nexus-mini", "--memory", "256m", "--disk", "3t")
	if code != 1 || !strings.Contains(errOut, "not enough free disk for 3072.0 GiB of new disks: ") || !strings.Contains(errOut, "ask for less --disk") {
		t.Errorf("create --disk 3t: exit %d, %q; want a refusal giving the free space", code, errOut)
	}
	if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "disk/huge") {
		t.Errorf("a refused create left a record:\n%s", out)
	}

	create(t, "disk/box", "--disk", "3g", "--mount-named", "data:/data,size=100m")
	// The named volume is the size asked for, in the guest and in nexus volume ls.
	if out := stack.MustNexus(t, "exec", "disk/box", "--", "df", "-k", "/data"); !strings.Contains(out, "/data") {
		t.Errorf("df /data: %q", out)
	} else if kib := dfKiB(t, out); kib < 80<<10 || kib > 100<<10 {
		t.Errorf("a 100 MiB volume is %d KiB in df:\n%s", kib, out)
	}
	if out := stack.MustNexus(t, "volume", "ls"); !strings.Contains(out, "data") || !strings.Contains(out, "100MiB") {
		t.Errorf("volume ls does not show the 100 MiB volume:\n%s", out)
	}
	if s := sandbox(t, "disk/box"); s.DiskMiB != 3072 {
		t.Errorf("ps --json: disk_mib %d, want 3072", s.DiskMiB)
	}
	// df -k /: the last line's second field is the file system's size in KiB. The guest grows
	// it online, beside its boot.
	testutil.WaitFor(t, 30*time.Second, func() error {
		out := stack.MustNexus(t, "exec", "disk/box", "--", "df", "-k", "/")
		kib := dfKiB(t, out)
		if kib > 3<<20 {
			t.Fatalf("the guest's root file system is %d KiB, more than its 3 GiB disk:\n%s", kib, out)
		}
		if kib < 2800<<10 {
			return fmt.Errorf("the guest's root file system is %d KiB on a 3 GiB disk, want it grown to nearly 3 GiB:\n%s", kib, out)
		}
		return nil
	})

	// The guest's memory comes with its heartbeat (every 5 s).
	var st api.SandboxStats
	testutil.WaitFor(t, 20*time.Second, func() error {
		raw := stack.MustNexus(t, "stats", "disk/box", "--json")
		var list []api.SandboxStats
		if err := json.Unmarshal([]byte(raw), &list); err != nil || len(list) != 1 {
			t.Fatalf("stats --json: %v: %s", err, raw)
		}
		if st = list[0]; st.GuestMemUsedBytes == 0 {
			return errors.New("no guest memory figure yet")
		}
		return nil
	})
	if st.DiskSizeBytes != 3<<30 || st.DiskUsedBytes <= 0 || st.DiskUsedBytes > st.DiskSizeBytes {
		t.Errorf("stats disk used/size %d/%d, want x/%d", st.DiskUsedBytes, st.DiskSizeBytes, int64(3<<30))
	}
	if st.GuestMemUsedBytes <= 0 || st.GuestMemUsedBytes >= 256<<20 {
		t.Errorf("stats guest memory used %d of a 256 MiB guest", st.GuestMemUsedBytes)
	}
	// -f --json keeps sampling: one JSON array per line, every 2 s, until interrupted.
	follow := stack.Command("stats", "disk/box", "-f", "--json")
	pipe, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(pipe)
	for i := range 2 {
		if !sc.Scan() {
			t.Fatalf("stats -f --json ended after %d samples: %v", i, sc.Err())
		}
		var sample []api.SandboxStats
		if err := json.Unmarshal(sc.Bytes(), &sample); err != nil || len(sample) != 1 || sample[0].Name != "disk/box" || sample[0].DiskSizeBytes != 3<<30 {
			t.Fatalf("stats -f --json sample %d: %v: %s", i, err, sc.Bytes())
		}
	}
	follow.Process.Kill()
	follow.Wait()
	if out := stack.MustNexus(t, "stats", "disk/box"); !strings.Contains(out, "GUEST USED/LIMIT/HOST RSS") || !strings.Contains(out, "/ 3.0GiB") {
		t.Errorf("stats table:\n%s", out)
	}
}

// dfKiB is the size column of the last line of `df -k PATH`.
func dfKiB(t *testing.T, out string) int64 {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 2 {
		t.Fatalf("df: %q", out)
	}
	kib, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("df: %q: %v", out, err)
	}
	return kib
}
