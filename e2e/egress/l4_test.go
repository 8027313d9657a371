package egress_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/audit"
)

// resolveMini resolves name with busybox nslookup at the gateway and returns the first IPv4.
// busybox sends A and AAAA with one ID in a guest whose clock is coarse and takes the first
// answer with that ID for A; the netstack answers them in order, so one try must do.
func resolveMini(t *testing.T, box, name string) string {
	t.Helper()
	out := mustSh(t, box, "nslookup "+name)
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "Address:" && strings.HasPrefix(f[1], "198.18.") {
			return f[1]
		}
	}
	var evs []string
	for _, e := range events(t, box, false) {
		if e.Layer == audit.LayerDNS {
			evs = append(evs, fmt.Sprintf("%+v", e))
		}
	}
	t.Fatalf("nslookup %s: no synthetic address in:\n%s\ndns events:\n%s", name, out, strings.Join(evs, "\n"))
	return ""
}

// TestCuratedL4 judges every kind of packet a curated guest can send: DNS, TCP, UDP, ICMP and
// IPv6, with busybox tools (nexus-mini).
func TestCuratedL4(t *testing.T) {
	const box = "egress/l4"
	create(t, box, "nexus-mini", "--allow-host", "example.test:7000")
	installProbe(t, box)
	id := sandboxID(t, box)
	ip := resolveMini(t, box, "example.test")

	// Allowed: plain TCP to an allowed port of an allowed name reaches the upstream.
	out := mustSh(t, box, `printf 'GET /l4-allowed HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc -w 5 `+ip+` 7000`)
	if !strings.Contains(out, "hello from fake example.test") || len(upstreams[plainHost].find("/l4-allowed")) != 1 {
		t.Fatalf("allowed tcp to example.test:7000: got %q", out)
	}
	ev := waitEvent(t, box, false, "allowed l4 tcp to example.test:7000", func(e audit.Event) bool {
		return e.Layer == audit.LayerL4 && e.Proto == "tcp" && e.Port == 7000 && e.Decision == audit.Allow
	})
	if ev.Host != "example.test" || ev.IP != ip || ev.Rule != "example.test:7000" || ev.Sandbox != id || ev.Time.IsZero() {
		t.Errorf("allowed event fields: %+v", ev)
	}
	// Ping to an allowed name's address is answered by the gateway.
	mustSh(t, box, "ping -c 1 -W 3 "+ip)

	type denial struct {
		what   string
		script string
		// clear is what the guest must see (stdout+stderr), empty: only a failing exit.
		clear  string
		match  func(audit.Event) bool
		reason string
	}
	before := upstreams[plainHost].count()
	for _, d := range []denial{
		{
			what: "a name off the list", script: "nslookup evil.example", clear: "NXDOMAIN",
			match:  func(e audit.Event) bool { return e.Layer == audit.LayerDNS && e.Host == "evil.example" },
			reason: "name is not on the allowlist",
		},
		{
			what: "an ip literal nobody resolved", script: "nc -w 5 203.0.113.7 443 </dev/null", clear: "Connection refused",
			match: func(e audit.Event) bool {
				return e.Layer == audit.LayerL4 && e.Proto == "tcp" && e.IP == "203.0.113.7" && e.Port == 443
			},
			reason: "ip was not resolved from an allowed name",
		},
		{
			what: "an allowed ip on a port that is not allowed", script: "nc -w 5 " + ip + " 7001 </dev/null", clear: "Connection refused",
			match: func(e audit.Event) bool {
				return e.Layer == audit.LayerL4 && e.Proto == "tcp" && e.IP == ip && e.Port == 7001 && e.Host == "example.test"
			},
			reason: "port 7001 is not allowed for example.test",
		},
		{
			what: "dns over udp to 8.8.8.8", script: "timeout 4 nslookup api.anthropic.com 8.8.8.8",
			match: func(e audit.Event) bool {
				return e.Layer == audit.LayerDNS && e.Proto == "udp" && e.IP == "8.8.8.8" && e.Port == 53
			},
			reason: "dns goes only to the gateway resolver 192.168.127.1",
		},
		{
			what: "dns over tcp to 8.8.8.8", script: "nc -w 5 8.8.8.8 53 </dev/null", clear: "Connection refused",
			match: func(e audit.Event) bool {
				return e.Layer == audit.LayerDNS && e.Proto == "tcp" && e.IP == "8.8.8.8" && e.Port == 53
			},
			reason: "dns goes only to the gateway resolver 192.168.127.1",
		},
		{
			what: "udp to an allowed host's ip on another port", script: "probe udp " + ip + ":7000 udp-curated", clear: "no reply",
			match: func(e audit.Event) bool {
				return e.Layer == audit.LayerL4 && e.Proto == "udp" && e.IP == ip && e.Port == 7000
			},
			reason: "udp is allowed only for dns to the gateway",
		},
		{
			what: "icmp to an ip that is not allowed", script: "ping -c 1 -W 3 198.51.100.9", clear: "100% packet loss",
			match: func(e audit.Event) bool {
				return e.Layer == audit.LayerL4 && e.Proto == "icmp" && e.IP == "198.51.100.9"
			},
			reason: "ip was not resolved from an allowed name",
		},
		{
			// The guest has no IPv6 route (connect fails in the guest); an adversary writing
			// IPv6 frames to the gateway's MAC itself gets no answer.
			what: "ipv6", script: "probe ipv6 2606:4700::1 443", clear: "network is unreachable",
			match: func(e audit.Event) bool {
				return e.Layer == audit.LayerL4 && e.Proto == "tcp" && e.IP == "2606:4700::1" && e.Port == 443
			},
			reason: "ipv6 is not supported: the sandbox network is IPv4 only",
		},
	} {
		t.Run(strings.ReplaceAll(d.what, " ", "_"), func(t *testing.T) {
			start := time.Now()
			out, errOut, code := sh(t, box, d.script)
			all := out + errOut
			if code == 0 {
				t.Fatalf("%s: %q succeeded in the guest: %q", d.what, d.script, all)
			}
			if d.clear != "" && !strings.Contains(all, d.clear) {
				t.Errorf("%s: guest output %q does not say %q", d.what, all, d.clear)
			}
			ev := waitEvent(t, box, true, d.what, d.match)
			if ev.Decision != audit.Deny || ev.Reason != d.reason || ev.Sandbox != id || ev.Time.Before(start.Add(-time.Second)) {
				t.Errorf("%s: event %+v; want deny, reason %q", d.what, ev, d.reason)
			}
			t.Logf("%s: guest saw %q in %.1fs", d.what, strings.TrimSpace(all), time.Since(start).Seconds())
		})
	}
	if n := upstreams[plainHost].count(); n != before {
		t.Errorf("denied attempts reached example.test's upstream (%d requests)", n-before)
	}
	if udpSeen.got("udp-curated") {
		t.Error("curated udp reached the upstream")
	}

	// nexus egress show: mode, allowlist and the DNS table.
	show := stack.MustNexus(t, "egress", "show", box)
	for _, want := range []string{"mode:     curated", "example.test:7000", "api.anthropic.com", "network:  curated", "example.test  " + ip} {
		if !strings.Contains(show, want) {
			t.Errorf("egress show lacks %q:\n%s", want, show)
		}
	}
	var view api.EgressView
	if err := json.Unmarshal([]byte(stack.MustNexus(t, "egress", "show", box, "--json")), &view); err != nil {
		t.Fatal(err)
	}
	if view.Network == nil || view.Network.Counters.Denied == 0 || len(view.Network.DNS) == 0 || view.Network.DNS[0].Name != "example.test" {
		t.Errorf("egress show --json: %+v", view.Network)
	}
}

// TestEgressNone: no NIC at all, so nothing can leave.
func TestEgressNone(t *testing.T) {
	const box = "egress/none"
	create(t, box, "nexus-mini", "--egress", "none")
	out := mustSh(t, box, "ip link; ls /sys/class/net")
	if strings.Contains(out, "eth0") || !strings.Contains(out, "lo") {
		t.Fatalf("--egress none: the guest has a network device:\n%s", out)
	}
	if _, _, code := sh(t, box, "nc -w 3 203.0.113.7 443 </dev/null"); code == 0 {
		t.Fatal("--egress none: a connection succeeded")
	}
	show := stack.MustNexus(t, "egress", "show", box)
	if !strings.Contains(show, "mode:     none") || !strings.Contains(show, "network:  none (no packet leaves)") {
		t.Errorf("egress show:\n%s", show)
	}
}

// TestUnknownAgent is refused with exit 2 and leaves nothing behind.
func TestUnknownAgent(t *testing.T) {
	_, errOut, code := stack.Nexus(t, "create", "egress/agent", "--image", "nexus-mini", "--agent", "nope", "-l", "nexus-test=1")
	if code != 2 || !strings.Contains(errOut, `unknown agent profile "nope"`) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
		t.Fatalf("create --agent nope: exit %d, stderr %q", code, errOut)
	}
	if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "egress/agent") {
		t.Fatalf("a refused create left a record:\n%s", out)
	}
}
