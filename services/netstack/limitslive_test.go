package netstack_test

import (
	"context"
	"testing"
	"time"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
)

// Limits change on a running network (nexus egress apply of a changed egress.limits): a cap
// that refused a second connection admits it once raised.
func TestLimitsChangeLive(t *testing.T) {
	e := newEnv(t, curated(t))
	const id = "sb-limits-live"
	fg, dst := e.flooder(t, id, netstackapi.Limits{MaxConns: 1})
	dial := func() error {
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		defer cancel()
		c, err := fg.DialTCP(ctx, dst)
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return err
	}
	if err := dial(); err != nil {
		t.Fatal(err)
	}
	if err := dial(); err == nil {
		t.Fatal("a second connection passed --max-conns 1")
	}
	if err := e.svc.UpdateLimits(id, netstackapi.Limits{MaxConns: 4}); err != nil {
		t.Fatal(err)
	}
	if err := dial(); err != nil {
		t.Fatalf("after raising the cap: %v", err)
	}
	if info, err := e.svc.Show(id); err != nil || info.Limits.MaxConns != 4 || info.Limits.ConnRate != netstackapi.DefaultLimits.ConnRate {
		t.Fatalf("info %+v %v", info.Limits, err)
	}
	if err := e.svc.UpdateLimits(id, netstackapi.Limits{MaxConns: -1}); err == nil {
		t.Fatal("a negative cap was taken")
	}
}
