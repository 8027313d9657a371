package gateway

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
)

// A fork keeps its parent's containment (issue 19): the CPU quota and the disk limits go from
// the parent's record into the snapshot's, from there into the fork's record and the vmm's fork
// request, so a sandbox cannot shed its --cpus, --disk-bps or --disk-iops by being forked.
// Memory and vCPUs were the snapshot's already.
func TestForkKeepsContainment(t *testing.T) {
	tg := newTestGateway(t)
	var mu sync.Mutex
	var asked []vmmapi.ForkRequest
	sub, err := tg.bus.Connect(t, bus.UserAdmin).Subscribe(vmmapi.Fork.Subject(bus.LocalHost), func(m *nats.Msg) {
		var r vmmapi.ForkRequest
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("fork request: %v: %s", err, m.Data)
		}
		mu.Lock()
		asked = append(asked, r)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	tg.add(t, &api.Sandbox{ID: NewID(), Name: "p/parent", Agent: "codex", MemoryMiB: 256, VCPUs: 2, CPUs: 0.5, DiskBps: 1 << 20, DiskIOPS: 100}, api.StateRunning)

	snap, err := tg.snapshot(tg.ctx, "p/parent", "limits", "snapshot create")
	if err != nil {
		t.Fatal(err)
	}
	if snap.CPUs != 0.5 || snap.DiskBps != 1<<20 || snap.DiskIOPS != 100 {
		t.Errorf("snapshot record: cpus %g, disk_bps %d, disk_iops %d; want the parent's 0.5, 1048576, 100", snap.CPUs, snap.DiskBps, snap.DiskIOPS)
	}
	// The fork and then a start of the stopped fork (which forks again) both keep them.
	child, err := tg.fork(tg.ctx, api.ForkRequest{Source: "limits", Name: "p/child"})
	if err != nil {
		t.Fatal(err)
	}
	rec := tg.get(t, child)
	if rec.CPUs != 0.5 || rec.DiskBps != 1<<20 || rec.DiskIOPS != 100 {
		t.Errorf("fork's record: cpus %g, disk_bps %d, disk_iops %d; want the parent's 0.5, 1048576, 100", rec.CPUs, rec.DiskBps, rec.DiskIOPS)
	}
	for _, st := range []api.State{api.StateStopping, api.StateStopped} {
		if err := tg.reg.Transition(tg.ctx, rec, st, "", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := tg.bootFork(tg.ctx, rec, rec.Fork, ""); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(asked) != 2 {
			return fmt.Errorf("the vmm was asked for %d forks, want 2", len(asked))
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, r := range asked {
		if r.CPUs != 0.5 || r.DiskBps != 1<<20 || r.DiskIOPS != 100 {
			t.Errorf("vmm fork request: cpus %g, disk_bps %d, disk_iops %d; want the parent's 0.5, 1048576, 100", r.CPUs, r.DiskBps, r.DiskIOPS)
		}
	}
}
