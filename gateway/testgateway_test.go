package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// testGateway is a gateway Service over a real test bus with a real registry; the vmm and the
// perimeter services are fakes that answer ok (fake records what they were asked).
type testGateway struct {
	*Service
	bus  *testutil.Bus
	ctx  context.Context
	fake *fakeServices
}

func newTestGateway(t *testing.T) *testGateway {
	t.Helper()
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserGateway)
	fake := startFakeServices(t, b.Connect(t, bus.UserAdmin))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reg, err := NewRegistry(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	g := &Service{cfg: Config{Bus: nc, Home: b.Home, Host: bus.LocalHost}, reg: reg, log: zerolog.Nop(), idle: &idleWatch{last: map[string]idleSample{}}}
	return &testGateway{Service: g, bus: b, ctx: ctx, fake: fake}
}

// lifecycle is the order add walks a record through.
var lifecycle = []api.State{api.StateStarting, api.StateRunning, api.StateStopping, api.StateStopped}

// add records sb (host and image filled in when empty) and walks it through the lifecycle up
// to state (api.StateCreated: not at all).
func (tg *testGateway) add(t *testing.T, sb *api.Sandbox, state api.State) *api.Sandbox {
	t.Helper()
	if sb.Host == "" {
		sb.Host = bus.LocalHost
	}
	if sb.Image == "" {
		sb.Image = "nexus-mini"
	}
	if err := tg.reg.Create(tg.ctx, sb); err != nil {
		t.Fatal(err)
	}
	if state == api.StateCreated {
		return sb
	}
	for _, s := range lifecycle {
		if err := tg.reg.Transition(tg.ctx, sb, s, "", nil); err != nil {
			t.Fatal(err)
		}
		if s == state {
			return sb
		}
	}
	t.Fatalf("add: %s is not a state of the lifecycle %v", state, lifecycle)
	return nil
}

// get is the registry's current record of sb.
func (tg *testGateway) get(t *testing.T, sb *api.Sandbox) *api.Sandbox {
	t.Helper()
	cur, err := tg.reg.Get(tg.ctx, sb.Name)
	if err != nil {
		t.Fatal(err)
	}
	return cur
}

// exists says whether the registry still has a record named like sb.
func (tg *testGateway) exists(t *testing.T, sb *api.Sandbox) bool {
	t.Helper()
	_, err := tg.reg.Get(tg.ctx, sb.Name)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// fakeServices answers every vmm and perimeter request with ok and records the vmm removes.
type fakeServices struct {
	mu      sync.Mutex
	removed []string
	// running are the VM ids the fake vmm of any host says run (inspect); others do not.
	running map[string]bool
	// calls are the subjects of every request, with their bodies; silent are the subject
	// prefixes (a lost host's, say) nothing answers.
	calls  []string
	silent []string
}

// silence makes requests to subjects starting with prefix go unanswered ("" to answer all).
func (f *fakeServices) silence(prefix ...string) {
	f.mu.Lock()
	f.silent = prefix
	f.mu.Unlock()
}

// called lists the requests (subject and body) to subjects starting with prefix.
func (f *fakeServices) called(prefix string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

func startFakeServices(t *testing.T, nc *nats.Conn) *fakeServices {
	t.Helper()
	f := &fakeServices{}
	ok, _ := bus.EncodeOK(struct{}{})
	for _, subj := range []string{bus.VMMAPI.All(), bus.NetstackAPI.All(), bus.MITMAPI.All(), bus.CredAPI.All()} {
		sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
			f.mu.Lock()
			if m.Subject == vmmapi.Remove.Subject(bus.LocalHost) {
				f.removed = append(f.removed, string(m.Data))
			}
			f.calls = append(f.calls, m.Subject+" "+string(m.Data))
			silent := slices.ContainsFunc(f.silent, func(p string) bool { return strings.HasPrefix(m.Subject, p) })
			f.mu.Unlock()
			if m.Reply == "" || silent {
				return
			}
			if info, ok := f.inspect(m); ok {
				m.Respond(info)
				return
			}
			m.Respond(ok)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

// inspect answers a vmm inspect of a VM in f.running with it running.
func (f *fakeServices) inspect(m *nats.Msg) ([]byte, bool) {
	parts := strings.Split(m.Subject, ".")
	if len(parts) < 3 || m.Subject != vmmapi.Inspect.Subject(parts[2]) {
		return nil, false
	}
	var r vmmapi.IDRequest
	if json.Unmarshal(m.Data, &r) != nil {
		return nil, false
	}
	f.mu.Lock()
	run := f.running[r.ID]
	f.mu.Unlock()
	if !run {
		return nil, false
	}
	b, _ := bus.EncodeOK(vmmapi.VMInfo{ID: r.ID, Running: true})
	return b, true
}
