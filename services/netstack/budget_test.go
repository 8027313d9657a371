package netstack_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/IniZio/nexus/internal/testutil"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/services/netstack"
	"github.com/IniZio/nexus/services/netstack/internal/fakeguest"
)

// limitCount sums the counts of a sandbox's aggregated events of one budget rule.
func limitCount(evs []audit.Event, sandbox, rule string) int {
	total := 0
	for _, ev := range evs {
		if ev.Sandbox == sandbox && ev.Rule == rule {
			var k int
			if _, err := fmt.Sscanf(ev.Reason, "%d ", &k); err == nil {
				total += k
			}
		}
	}
	return total
}

// flooder adds a second network with limits l to e's manager, attaches a fake guest and returns
// it with api.test:8080 as that guest resolved it.
func (e *env) flooder(t *testing.T, id string, l netstackapi.Limits) (*fakeguest.Guest, netip.AddrPort) {
	t.Helper()
	sock := shortSocket(t)
	if _, err := e.svc.CreateNetwork(context.Background(), netstack.Spec{SandboxID: id, SocketPath: sock, Policy: curated(t), Limits: l}); err != nil {
		t.Fatal(err)
	}
	fg, err := fakeguest.Dial(e.ctx, sock, fakeguest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fg.Close() })
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	ips, err := fg.LookupA(ctx, "api.test")
	if err != nil {
		t.Fatal(err)
	}
	return fg, netip.AddrPortFrom(ips[0], 8080)
}

// TestBudgetsCapAFlooder: a sandbox that floods connections and DNS queries is held to its
// budgets, each refusal counted in one aggregated event per window, while its neighbour on the
// same host (default budgets) is served throughout.
func TestBudgetsCapAFlooder(t *testing.T) {
	e := newEnv(t, curated(t)) // the neighbour, sandboxID
	const flooder = "sb-flood"
	fg, dst := e.flooder(t, flooder, netstackapi.Limits{MaxConns: 3, DNSRate: 5})
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()

	// Concurrent connections: three held open, the next ones reset.
	var held []net.Conn
	for range 3 {
		c, err := fg.DialTCP(ctx, dst)
		if err != nil {
			t.Fatalf("connection within the cap: %v", err)
		}
		held = append(held, c)
	}
	refused := 0
	for range 10 {
		if c, err := fg.DialTCP(ctx, dst); err == nil {
			c.Close()
		} else {
			refused++
		}
	}
	if refused != 10 {
		t.Fatalf("%d of 10 connections past --max-conns 3 refused", refused)
	}
	// The neighbour is served meanwhile.
	if body, err := e.httpGet(t, netip.AddrPortFrom(e.lookup(t, "api.test"), 8080), "api.test"); err != nil || body != "hello from api.test" {
		t.Fatalf("neighbour: %q %v", body, err)
	}
	for _, c := range held {
		c.Close()
	}

	// DNS: a burst of 5, then 5 a second; a flood of 40 is mostly refused.
	dnsRefused := 0
	for range 40 {
		m, err := fg.Exchange(ctx, "udp", netip.MustParseAddrPort(netstack.GatewayIP+":53"), "api.test", dns.TypeA)
		if err == nil && m.Rcode == dns.RcodeRefused {
			dnsRefused++
		}
	}
	if dnsRefused < 20 {
		t.Fatalf("only %d of 40 queries past --dns-rate 5 refused", dnsRefused)
	}
	for range 10 { // the neighbour's queries all pass
		e.lookup(t, "api.test")
	}

	testutil.WaitFor(t, 10*time.Second, func() error {
		evs := e.log.all()
		if k := limitCount(evs, flooder, "max_conns"); k != 10 {
			return fmt.Errorf("max_conns events count %d refusals, want 10", k)
		}
		if k := limitCount(evs, flooder, "dns_rate"); k != dnsRefused {
			return fmt.Errorf("dns_rate events count %d refusals, want %d", k, dnsRefused)
		}
		return nil
	})
	evs := e.log.all()
	n := 0
	for _, ev := range evs {
		if ev.Rule == "max_conns" || ev.Rule == "dns_rate" || ev.Rule == "conn_rate" {
			n++
			if ev.Sandbox != flooder || ev.Decision != audit.Deny {
				t.Errorf("limit event %+v", ev)
			}
		}
	}
	if n > 6 { // the refusals above took a few seconds at most: one event per budget and second
		t.Errorf("%d limit events for %d refusals: not aggregated", n, 10+dnsRefused)
	}
	info, err := e.svc.Show(flooder)
	if err != nil {
		t.Fatal(err)
	}
	if info.Limits.MaxConns != 3 || info.Limits.DNSRate != 5 || info.Limits.ConnRate != netstackapi.DefaultLimits.ConnRate ||
		info.Counters.Limited != uint64(10+dnsRefused) {
		t.Errorf("show: limits %+v counters %+v", info.Limits, info.Counters)
	}
}

// TestConnRate: new connections past the per-second bucket are reset.
func TestConnRate(t *testing.T) {
	e := newEnv(t, curated(t))
	const flooder = "sb-rate"
	fg, dst := e.flooder(t, flooder, netstackapi.Limits{ConnRate: 2})
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	refused := 0
	for range 20 {
		c, err := fg.DialTCP(ctx, dst)
		if err != nil {
			refused++
			continue
		}
		c.Close()
	}
	if refused < 10 {
		t.Fatalf("only %d of 20 connections past --conn-rate 2 refused", refused)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if k := limitCount(e.log.all(), flooder, "conn_rate"); k != refused {
			return errors.New("conn_rate events do not count every refusal")
		}
		return nil
	})
}
