package portfwd

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

// List tells what a forward relays, for idle handling: connections open now and taken so far.
func TestListReportsConnections(t *testing.T) {
	st := newStack(t, nil)
	g := startFakeGuest(t, st, "sb-act")
	p := freePort(t)
	g.set(int(p), echoServer(t))
	st.listeners("sb-act", "default/act", p)
	testutil.WaitFor(t, 5*time.Second, func() error { return echoOnce(p, "ping") })
	f, err := forwardState(st, "sb-act", p)
	if err != nil {
		t.Fatal(err)
	}
	before := f.Accepted
	if before == 0 {
		t.Fatalf("after a relayed connection: %+v", f)
	}
	c, err := net.Dial("tcp", hostAddr(p))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, 5*time.Second, func() error {
		f, err := forwardState(st, "sb-act", p)
		if err != nil {
			return err
		}
		if f.Conns != 1 || f.Accepted != before+1 {
			return fmt.Errorf("one connection open: conns %d, accepted %d (was %d)", f.Conns, f.Accepted, before)
		}
		return nil
	})
}
