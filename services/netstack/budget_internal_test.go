package netstack

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/policy"
)

type sinkLog struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (s *sinkLog) Emit(_ context.Context, ev audit.Event) {
	s.mu.Lock()
	s.evs = append(s.evs, ev)
	s.mu.Unlock()
}

func (s *sinkLog) all() []audit.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]audit.Event(nil), s.evs...)
}

// budgetNetwork is a network with only what the budgets need.
func budgetNetwork(t *testing.T, l netstackapi.Limits) (*network, *sinkLog) {
	log := &sinkLog{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &network{
		svc:    &Manager{cfg: ManagerConfig{Audit: log}, log: zerolog.Nop()},
		log:    zerolog.Nop(),
		id:     "sb-budget",
		ctx:    ctx,
		cancel: cancel,
		budget: newBudget(l),
	}, log
}

var tcpVerdict = verdict{ev: audit.Event{Layer: audit.LayerL4, Proto: "tcp", Host: "a.test", Port: 8080, Decision: audit.Allow}}

func TestBudgetDefaults(t *testing.T) {
	n, _ := budgetNetwork(t, netstackapi.Limits{DNSRate: 7})
	want := netstackapi.DefaultLimits
	want.DNSRate = 7
	if n.budget.limits() != want {
		t.Fatalf("limits %+v, want %+v", n.budget.limits(), want)
	}
	for _, bad := range []netstackapi.Limits{{MaxConns: -1}, {ConnRate: -1}, {DNSRate: -2}, {EgressBandwidth: -1}, {MaxConns: netstackapi.MaxMaxConns + 1}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestMaxConnsAndConnRate(t *testing.T) {
	n, log := budgetNetwork(t, netstackapi.Limits{MaxConns: 2, ConnRate: 3})
	if !n.admit(tcpVerdict) || !n.admit(tcpVerdict) {
		t.Fatal("first two flows refused")
	}
	for range 5 {
		if n.admit(tcpVerdict) {
			t.Fatal("a third concurrent flow admitted")
		}
	}
	n.release()
	if !n.admit(tcpVerdict) { // a freed slot, the third token of the burst
		t.Fatal("a flow refused after one ended")
	}
	n.release()
	if n.admit(tcpVerdict) { // a slot is free, the bucket is empty
		t.Fatal("a fourth new flow within the second admitted")
	}
	n.flushLimits()
	evs := log.all()
	if len(evs) != 2 {
		t.Fatalf("want one aggregated event per budget, got %+v", evs)
	}
	for _, ev := range evs {
		switch ev.Rule {
		case RuleMaxConns:
			if !strings.HasPrefix(ev.Reason, "5 new connections refused in 1s: 2 open at once") {
				t.Errorf("max_conns: %+v", ev)
			}
		case RuleConnRate:
			if !strings.HasPrefix(ev.Reason, "1 new connections refused in 1s: over 3 per second") {
				t.Errorf("conn_rate: %+v", ev)
			}
		default:
			t.Errorf("unexpected %+v", ev)
		}
		if ev.Decision != audit.Deny || ev.Sandbox != "sb-budget" || ev.Host != "" || ev.Proto != "tcp" {
			t.Errorf("event %+v", ev)
		}
	}
	if n.budget.limited.Load() != 6 {
		t.Errorf("limited = %d, want 6", n.budget.limited.Load())
	}
}

// TestLimitWindow: hits are audited once per window, by the window's timer.
func TestLimitWindow(t *testing.T) {
	n, log := budgetNetwork(t, netstackapi.Limits{MaxConns: 1})
	n.admit(tcpVerdict)
	for range 3 {
		n.admit(tcpVerdict)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if len(log.all()) == 0 {
			return errors.New("no event after the window")
		}
		return nil
	})
	evs := log.all()
	if len(evs) != 1 || evs[0].Rule != RuleMaxConns || !strings.HasPrefix(evs[0].Reason, "3 new") {
		t.Fatalf("events %+v", evs)
	}
}

func TestEgressBucket(t *testing.T) {
	n, log := budgetNetwork(t, netstackapi.Limits{EgressBandwidth: 64 << 10})
	if b := n.budget.egress.Burst(); b != 64<<10 {
		t.Fatalf("burst %d", b)
	}
	var sink strings.Builder
	w := egressWriter{n, &sink}
	if _, err := w.Write(make([]byte, 64<<10)); err != nil { // the burst: at once
		t.Fatal(err)
	}
	if n.budget.limited.Load() != 0 {
		t.Fatal("the first burst was held back")
	}
	if _, err := w.Write(make([]byte, 1<<10)); err != nil { // past it: waits for tokens
		t.Fatal(err)
	}
	if sink.Len() != 65<<10 {
		t.Fatalf("wrote %d bytes", sink.Len())
	}
	n.flushLimits()
	evs := log.all()
	if len(evs) != 1 || evs[0].Rule != RuleEgressBandwidth || evs[0].Decision != audit.Allow || evs[0].Bytes != 1<<10 ||
		!strings.Contains(evs[0].Reason, "egress is held to 64 KiB per second") {
		t.Fatalf("events %+v", evs)
	}
	// A large write is cut into bursts rather than refused.
	big := netstackapi.Limits{EgressBandwidth: 1 << 40}
	n2, _ := budgetNetwork(t, big)
	var sink2 strings.Builder
	if k, err := (egressWriter{n2, &sink2}).Write(make([]byte, 1<<20)); err != nil || k != 1<<20 {
		t.Fatalf("large write: %d, %v", k, err)
	}
}

func TestNetworkCloseFlushesLimits(t *testing.T) {
	n, log := budgetNetwork(t, netstackapi.Limits{MaxConns: 1})
	n.admit(tcpVerdict)
	n.admit(tcpVerdict)
	n.conns, n.table = newConntrack(), newDNSTable()
	n.allow, _ = policy.NewAllowlist(nil)
	n.close()
	if evs := log.all(); len(evs) != 1 || evs[0].Rule != RuleMaxConns {
		t.Fatalf("events at close %+v", evs)
	}
}
