package gateway

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
	"github.com/IniZio/nexus/pkg/bus"
)

// Port-forwarded connections are activity: a sandbox with one open through its forward is not
// paused, and one whose forward took a connection since the last sample starts its clock again.
func TestIdleSweepCountsPortForwards(t *testing.T) {
	tg := newTestGateway(t)
	ctx, g := tg.ctx, tg.Service
	g.idle = &idleWatch{last: map[string]idleSample{}}
	open := tg.add(t, &api.Sandbox{Name: "port/open", IdleTimeout: "10s", VCPUs: 1}, api.StateRunning)
	taken := tg.add(t, &api.Sandbox{Name: "port/taken", IdleTimeout: "10s", VCPUs: 1}, api.StateRunning)

	var mu sync.Mutex
	accepted := uint64(1)
	nc := tg.bus.Connect(t, bus.UserAdmin)
	sub, err := nc.Subscribe(portfwdapi.List.Subject(bus.LocalHost), func(m *nats.Msg) {
		mu.Lock()
		fwds := []portfwdapi.Forward{
			{ID: open.ID, Port: 3000, State: portfwdapi.StateForwarding, Conns: 1, Accepted: 1},
			{ID: taken.ID, Port: 8080, State: portfwdapi.StateForwarding, Accepted: accepted},
		}
		mu.Unlock()
		b, _ := bus.EncodeOK(fwds)
		m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	nc.Flush()

	start := time.Now()
	g.sweepIdle(ctx, start.Add(-20*time.Second)) // first sight: the clocks start
	mu.Lock()
	accepted = 2 // a connection through port/taken's forward since
	mu.Unlock()
	g.sweepIdle(ctx, start.Add(time.Second))
	g.sweepIdle(ctx, start.Add(8*time.Second))
	for _, sb := range []*api.Sandbox{open, taken} {
		if st := tg.get(t, sb); st.State != api.StateRunning {
			t.Fatalf("%s %s %q 7 s after port-forward activity with a 10s timeout", sb.Name, st.State, st.Reason)
		}
	}
	g.sweepIdle(ctx, start.Add(12*time.Second))
	if st := tg.get(t, taken); st.State != api.StatePaused {
		t.Errorf("port/taken is %s 11 s after its last forwarded connection, want paused", st.State)
	}
	if st := tg.get(t, open); st.State != api.StateRunning {
		b, _ := json.Marshal(st)
		t.Errorf("port/open, with a connection open through its forward, is %s: %s", st.State, b)
	}
}
