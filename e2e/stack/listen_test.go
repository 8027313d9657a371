package stack_test

import (
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

// TestListenersLoopbackOnly: a stack started on a fresh home listens on loopback only; no
// socket of its processes is bound to another address (the mitm's first start used to open a
// listener on every interface).
func TestListenersLoopbackOnly(t *testing.T) {
	e := env(t)
	startUp(t, e)
	rows, _ := statusOf(t, e)
	pids := map[int]bool{}
	for _, r := range rows {
		pids[r.PID] = true
	}
	n := 0
	for pid := range pids {
		ls, err := testutil.Listeners(pid)
		if err != nil {
			t.Fatalf("listeners of %d: %v", pid, err)
		}
		for _, l := range ls {
			n++
			if !l.Addr.Addr().IsLoopback() {
				t.Errorf("pid %d listens on %s %s", pid, l.Network, l.Addr)
			}
		}
	}
	if n < 2 { // the bus and the mitm at least
		t.Fatalf("found %d listeners of pids %v: the scan sees nothing", n, pids)
	}
}
