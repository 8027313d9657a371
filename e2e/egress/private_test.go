package egress_test

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
)

// rebindAnswers are what the stack's upstream resolver (a fake on loopback, --upstream-dns)
// answers: names under the allowed wildcard *.rebind.test that lead to the LAN, the metadata
// service, CGNAT and the host itself. The addresses other than loopback are canaries in a
// network namespace the test creates.
var rebindAnswers = map[string]string{
	"ten.rebind.test.":   "10.20.0.5",
	"meta.rebind.test.":  "169.254.169.254",
	"cgnat.rebind.test.": "100.64.0.9",
	"lo.rebind.test.":    "127.0.0.1",
}

// startFakeDNS serves rebindAnswers on a loopback UDP port (everything else: NXDOMAIN) and
// returns its address for --upstream-dns.
func startFakeDNS(f *testutil.Fixture) (string, error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Rcode = dns.RcodeNameError
		if len(r.Question) == 1 {
			q := r.Question[0]
			if a, ok := rebindAnswers[strings.ToLower(q.Name)]; ok {
				m.Rcode = dns.RcodeSuccess
				if q.Qtype == dns.TypeA {
					m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
						A: netip.MustParseAddr(a).AsSlice()})
				}
			}
		}
		_ = w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	f.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String(), nil
}

// TestPrivateAddresses: an allowed name may not lead to a private address (DNS rebinding), nor
// may an IP literal, in curated mode (the mitm path included) or allow-all; --allow-private
// names the one network that is reachable. Every refusal is audited private_address and no
// canary gets a byte it should not.
func TestPrivateAddresses(t *testing.T) {
	canary := testutil.NewCanary(t, testutil.CanaryConfig{Addrs: []string{"10.20.0.5/24", "169.254.169.254", "100.64.0.9"}, TCP: []int{80, 443}})
	const curatedBox = "egress/private"
	create(t, curatedBox, "nexus-mini", "--allow-host", "*.rebind.test", "--allow-private", "10.20.0.0/24")

	// Curated: the wildcard allows the names, never their private answers.
	refusedAnswer(t, curatedBox, "meta.rebind.test", "169.254.169.254")
	refusedAnswer(t, curatedBox, "cgnat.rebind.test", "100.64.0.9")
	refusedAnswer(t, curatedBox, "lo.rebind.test", "127.0.0.1")
	// The mitm path: port 80 with an allowed Host goes through the shim; the literal is refused
	// before it (the name's answer was never handed out).
	refusedLiteral(t, curatedBox, "169.254.169.254", 80, "meta.rebind.test")
	refusedLiteral(t, curatedBox, "100.64.0.9", 443, "cgnat.rebind.test")
	if got := canary.Arrived(); len(got) > 0 {
		t.Fatalf("canary reached: %v", got)
	}
	// --allow-private 10.20.0.0/24: that network is reachable by an allowed name, through the
	// mitm, which dials the address the netstack judged.
	out := mustSh(t, curatedBox, "nslookup ten.rebind.test")
	if !strings.Contains(out, "10.20.0.5") {
		t.Fatalf("nslookup ten.rebind.test with --allow-private 10.20.0.0/24:\n%s", out)
	}
	out = mustSh(t, curatedBox, `printf 'GET /allowed-private HTTP/1.0\r\nHost: ten.rebind.test\r\n\r\n' | nc -w 5 10.20.0.5 80`)
	if !strings.Contains(out, "canary") {
		t.Fatalf("ten.rebind.test:80 with --allow-private: %q", out)
	}
	waitEvent(t, curatedBox, false, "the mitm's request to ten.rebind.test", func(e audit.Event) bool {
		return e.Layer == audit.LayerHTTP && e.Host == "ten.rebind.test" && e.Decision == audit.Allow && e.Path == "/allowed-private"
	})
	got := canary.Arrived()
	if len(got) != 1 || got[0].Local.Addr().String() != "10.20.0.5" || !strings.HasPrefix(string(got[0].Data), "GET /allowed-private ") {
		t.Fatalf("canary arrivals %v, want the one request to 10.20.0.5", got)
	}
	// Allow-all never reaches the LAN or the metadata service either: TestAllowAll checks it
	// on its sandbox during its window (privateRefusedInAllowAll).
}

// privateRefusedInAllowAll: an allow-all sandbox (open internet) never reaches the LAN or the
// metadata service, as a literal or as a name's answer, and no canary gets a byte.
func privateRefusedInAllowAll(t *testing.T, openBox string) {
	canary := testutil.NewCanary(t, testutil.CanaryConfig{Addrs: []string{"10.20.0.5/24", "169.254.169.254"}, TCP: []int{80}})
	refusedLiteral(t, openBox, "10.20.0.5", 80, "x")
	refusedLiteral(t, openBox, "169.254.169.254", 80, "x")
	refusedAnswer(t, openBox, "ten.rebind.test", "10.20.0.5")
	if got := canary.Arrived(); len(got) != 0 {
		t.Fatalf("allow-all reached a canary: %v", got)
	}
}

// refusedAnswer: the guest's lookup of name does not get its private answer addr, and the
// refusal is audited private_address.
func refusedAnswer(t *testing.T, box, name, addr string) {
	t.Helper()
	out, _, code := sh(t, box, "nslookup "+name)
	if strings.Contains(out, addr) {
		t.Errorf("%s: nslookup %s = exit %d, answered:\n%s", box, name, code, out)
	}
	waitEvent(t, box, true, "dns "+name+" refused as private_address", func(e audit.Event) bool {
		return e.Layer == audit.LayerDNS && e.Host == name && e.Rule == "private_address" && strings.Contains(e.Reason, addr)
	})
}

// refusedLiteral: a connection to the private address addr gets nothing from its canary, and the
// refusal is audited private_address.
func refusedLiteral(t *testing.T, box, addr string, port int, host string) {
	t.Helper()
	out, _, _ := sh(t, box, fmt.Sprintf(`printf 'GET /private HTTP/1.0\r\nHost: %s\r\n\r\n' | nc -w 5 %s %d`, host, addr, port))
	if strings.Contains(out, "canary") {
		t.Errorf("%s reached %s:%d: %q", box, addr, port, out)
	}
	waitEvent(t, box, true, fmt.Sprintf("tcp %s:%d refused as private_address", addr, port), func(e audit.Event) bool {
		return e.Layer == audit.LayerL4 && e.Proto == "tcp" && e.IP == addr && e.Port == port && e.Rule == "private_address"
	})
}
