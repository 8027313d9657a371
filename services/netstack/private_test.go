package netstack_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
)

// privateAnswers are what the fake upstream resolver answers for names under rebind.test: an
// allowed wildcard whose answers lead to the host, the LAN or the metadata service.
var privateAnswers = map[string][]netip.Addr{
	"lo.rebind.test.":    {netip.MustParseAddr("127.0.0.1")},
	"ten.rebind.test.":   {netip.MustParseAddr("10.20.0.5")},
	"meta.rebind.test.":  {netip.MustParseAddr("169.254.169.254")},
	"cgnat.rebind.test.": {netip.MustParseAddr("100.64.0.9")},
	"zero.rebind.test.":  {netip.MustParseAddr("0.0.0.0")},
	"bcast.rebind.test.": {netip.MustParseAddr("255.255.255.255")},
	"mcast.rebind.test.": {netip.MustParseAddr("224.0.0.251")},
	"mixed.rebind.test.": {netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("192.168.1.1")},
	"pub.rebind.test.":   {netip.MustParseAddr("203.0.113.10")},
}

func TestPrivateAnswerRefused(t *testing.T) {
	for _, mode := range []string{netstackapi.ModeCurated, netstackapi.ModeAllowAll} {
		t.Run(mode, func(t *testing.T) {
			pol := netstackapi.Policy{Mode: mode, Allow: rules(t, "*.rebind.test")}
			if mode == netstackapi.ModeAllowAll {
				pol.Allow = nil
			}
			e := newEnv(t, pol)
			for name, ips := range privateAnswers {
				name = strings.TrimSuffix(name, ".")
				if name == "pub.rebind.test" {
					continue
				}
				ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
				got, err := e.guest.LookupA(ctx, name)
				cancel()
				if err == nil || !strings.Contains(err.Error(), "REFUSED") {
					t.Errorf("lookup %s = %v, %v: want REFUSED", name, got, err)
				}
				e.log.waitEvent(t, audit.Event{Layer: "dns", Host: name, Decision: "deny", Rule: "private_address", Reason: "answer " + ips[len(ips)-1].String() + " is "})
			}
			if ip := e.lookup(t, "pub.rebind.test"); ip.String() != "203.0.113.10" {
				t.Errorf("public answer = %s", ip)
			}
			// A refused answer is not recorded: connecting to it is not "resolved from an allowed name".
			info, _ := e.svc.Show(sandboxID)
			for _, d := range info.DNS {
				if d.Name != "pub.rebind.test" {
					t.Errorf("dns table holds refused answer %+v", d)
				}
			}
		})
	}
}

func TestPrivateAnswerAllowedByCIDR(t *testing.T) {
	pol := netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rules(t, "*.rebind.test"), AllowPrivate: []string{"10.20.0.0/16"}}
	e := newEnv(t, pol)
	if ip := e.lookup(t, "ten.rebind.test"); ip.String() != "10.20.0.5" {
		t.Errorf("ten.rebind.test = %s", ip)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if _, err := e.guest.LookupA(ctx, "meta.rebind.test"); err == nil {
		t.Error("169.254.169.254 answered although only 10.20.0.0/16 is allowed")
	}
}

func TestAllowPrivateValidated(t *testing.T) {
	e := newEnv(t, curated(t))
	for _, bad := range []string{"0.0.0.0/0", "8.8.8.0/24", "nope"} {
		_, err := e.svc.UpdateNetwork(context.Background(), sandboxID, netstackapi.Policy{Mode: netstackapi.ModeCurated, AllowPrivate: []string{bad}})
		if err == nil || !strings.Contains(err.Error(), "invalid --allow-private") {
			t.Errorf("allow_private %q: %v", bad, err)
		}
	}
}

// TestPrivateLiteral: an IP literal of a private address is refused in every mode, allow-all
// included, unless --allow-private names it; nothing reaches the canary at that address.
func TestPrivateLiteral(t *testing.T) {
	canary := testutil.NewCanary(t, testutil.CanaryConfig{Addrs: []string{"10.20.0.5/24", "169.254.169.254", "100.64.0.9"}, TCP: []int{80}, UDP: []int{53, 5353}})
	allowAll := netstackapi.Policy{Mode: netstackapi.ModeAllowAll}
	e := newEnv(t, allowAll)
	for _, a := range canary.Addrs {
		if _, err := e.httpGet(t, netip.AddrPortFrom(a, 80), "x"); err == nil {
			t.Errorf("allow-all reached %s:80", a)
		}
		e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", IP: a.String(), Port: 80, Decision: "deny", Rule: "private_address"})
		c, err := e.guest.DialUDP(netip.AddrPortFrom(a, 5353))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("ping"))
		c.Close()
		e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "udp", IP: a.String(), Port: 5353, Decision: "deny", Rule: "private_address"})
	}
	canary.RequireNothingArrived(t)

	// Named explicitly, the canary's network is reachable; the metadata address still is not.
	allowAll.AllowPrivate = []string{"10.20.0.0/24"}
	if _, err := e.svc.UpdateNetwork(context.Background(), sandboxID, allowAll); err != nil {
		t.Fatal(err)
	}
	body, err := e.httpGet(t, netip.MustParseAddrPort("10.20.0.5:80"), "x")
	if err != nil || body != "canary\n" {
		t.Fatalf("allow-private 10.20.0.0/24: GET 10.20.0.5 = %q, %v", body, err)
	}
	if _, err := e.httpGet(t, netip.MustParseAddrPort("169.254.169.254:80"), "x"); err == nil {
		t.Error("169.254.169.254 reached with only 10.20.0.0/24 allowed")
	}
	if got := canary.Arrived(); len(got) != 1 || got[0].Local.Addr().String() != "10.20.0.5" {
		t.Errorf("canary got %v, want one connection to 10.20.0.5", got)
	}
}

// TestCuratedPrivateLiteralOnAllowlist: an allowlisted IP literal that is private needs
// --allow-private too.
func TestCuratedPrivateLiteralOnAllowlist(t *testing.T) {
	canary := testutil.NewCanary(t, testutil.CanaryConfig{Addrs: []string{"10.20.0.5/24"}, TCP: []int{5432}})
	e := newEnv(t, netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rules(t, "10.20.0.5:5432")})
	if _, err := e.httpGet(t, netip.MustParseAddrPort("10.20.0.5:5432"), "x"); err == nil {
		t.Error("reached 10.20.0.5:5432 without --allow-private")
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", IP: "10.20.0.5", Port: 5432, Decision: "deny", Rule: "private_address"})
	canary.RequireNothingArrived(t)
}

// TestConnectCarriesJudgedAddress: the shim's CONNECT names the address the netstack judged
// (here the resolver override's real target), so the mitm never resolves the name itself.
func TestConnectCarriesJudgedAddress(t *testing.T) {
	e := newEnv(t, curated(t))
	ip := e.lookup(t, "web.test")
	if _, err := e.httpGet(t, netip.AddrPortFrom(ip, 80), "web.test"); err != nil {
		t.Fatal(err)
	}
	seen := e.up.connect.seenList()
	if len(seen) != 1 || seen[0].dial != e.up.tlsSrv.Listener.Addr().String() {
		t.Fatalf("CONNECT %+v: want Nexus-Dial-Addr %s", seen, e.up.tlsSrv.Listener.Addr())
	}
}
