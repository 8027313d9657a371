package netstack

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rs/zerolog"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/policy"
)

// judgeNetwork is a network with only what decisions need: policy, DNS table, overrides.
func judgeNetwork(tb testing.TB, names int) *network {
	var rs []policy.Rule
	for i := range 20 {
		rs = append(rs, policy.Rule{Host: fmt.Sprintf("host%d.example.com", i)})
	}
	rs = append(rs, policy.Rule{Host: "*.cdn.example.net"})
	pol, allow, err := normalizePolicy(netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rs}, time.Now())
	if err != nil {
		tb.Fatal(err)
	}
	ov, _ := newOverrides(nil)
	n := &network{
		svc:   &Manager{cfg: ManagerConfig{DNSGrace: time.Minute}, overrides: ov, log: zerolog.Nop()},
		pol:   pol,
		allow: allow,
		table: newDNSTable(),
	}
	now := time.Now()
	for i := range names {
		ip := netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)})
		n.table.record(fmt.Sprintf("a%d.cdn.example.net", i), []netip.Addr{ip}, 60, now)
	}
	return n
}

func TestJudgeTCPGraceAndExpiry(t *testing.T) {
	n := judgeNetwork(t, 1)
	ip := netip.MustParseAddr("203.0.0.0")
	if v := n.judgeTCP(ip, 443, n.namesFor(ip, time.Now())); !v.allowed() || !v.shim || v.ev.Host != "a0.cdn.example.net" || v.ev.Rule != "*.cdn.example.net:443,80" {
		t.Fatalf("fresh answer: %+v", v)
	}
	// An answer past TTL + grace no longer admits connections.
	n.table.record("a0.cdn.example.net", []netip.Addr{ip}, 1, time.Now().Add(-2*time.Minute))
	n.table.mu.Lock()
	n.table.names["a0.cdn.example.net"].ips[ip] = time.Now().Add(-2 * time.Minute)
	n.table.mu.Unlock()
	if v := n.judgeTCP(ip, 443, n.namesFor(ip, time.Now())); v.allowed() || v.ev.Decision != audit.Deny {
		t.Fatalf("expired answer still allowed: %+v", v)
	}
}

// BenchmarkJudgeTCP is the policy cost of one SYN: DNS-table lookup plus rule match.
func BenchmarkJudgeTCP(b *testing.B) {
	n := judgeNetwork(b, 4000)
	ip := netip.AddrFrom4([4]byte{203, 0, 7, 7})
	for b.Loop() {
		if v := n.judgeTCP(ip, 443, n.namesFor(ip, time.Now())); !v.allowed() {
			b.Fatal(v.ev.Reason)
		}
	}
}
