package egress_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/audit"
)

// TestAskMode: on an --egress-ask sandbox a lookup of a host off the list is held and becomes
// a pending request; approved, the guest's retry resolves and its connection goes through;
// rejected, the held lookup fails as it would have and nothing reaches the host. A restart of
// the stack in the middle keeps the pending requests (and, keepAcrossRestart, the perimeter of
// running sandboxes).
func TestAskMode(t *testing.T) {
	const box = "egress/ask"
	create(t, box, "nexus-mini", "--allow-host", "api.github.com", "--egress-ask")
	pending := func(host string) (api.EgressRequest, error) {
		var list []api.EgressRequest
		if err := json.Unmarshal([]byte(stack.MustNexus(t, "egress", "requests", "--json")), &list); err != nil {
			return api.EgressRequest{}, err
		}
		for _, r := range list {
			if r.Sandbox == box && r.Host == host {
				return r, nil
			}
		}
		return api.EgressRequest{}, fmt.Errorf("no pending request for %s in %+v", host, list)
	}

	// A guest script run in the background, and its end.
	type result struct {
		out  string
		code int
	}
	background := func(script string) chan result {
		done := make(chan result, 1)
		go func() {
			out, _, code := sh(t, box, script)
			done <- result{out, code}
		}()
		return done
	}
	wait := func(done chan result) (res result) {
		t.Helper()
		testutil.WaitFor(t, 90*time.Second, func() error {
			select {
			case res = <-done:
				return nil
			default:
				return fmt.Errorf("the guest's script has not finished")
			}
		})
		return res
	}
	request := func(host string, port int) (req api.EgressRequest) {
		t.Helper()
		if err := testutil.Poll(30*time.Second, func() (err error) {
			if req, err = pending(host); err == nil && req.Port != port {
				err = fmt.Errorf("pending request %+v is not for port %d", req, port)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return req
	}

	// The guest keeps asking (as a resolver retries); a person approves meanwhile.
	done := background(`for i in 1 2 3 4 5 6 7 8; do ip=$(nslookup example.test 2>/dev/null | awk '/^Address: 198\.18\./{print $2}'); ` +
		`[ -n "$ip" ] && break; done; [ -n "$ip" ] || exit 3; printf 'GET /ask-approved HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc -w 5 $ip 7000`)
	req := request(plainHost, 0)
	out := stack.MustNexus(t, "egress", "approve", req.ID, "--port", "7000", "--for", "10m")
	if !strings.Contains(out, "+ example.test:7000") {
		t.Fatalf("egress approve printed %q", out)
	}
	if res := wait(done); res.code != 0 || !strings.Contains(res.out, "hello from fake example.test") || len(upstreams[plainHost].find("/ask-approved")) != 1 {
		t.Fatalf("after approve: exit %d %q", res.code, res.out)
	}
	if _, err := pending(plainHost); err == nil {
		t.Error("the approved request is still pending")
	}

	// A connection to a port not allowed is held (its handshake unanswered): approved, it
	// proceeds; rejected, it is refused at once, audited ask_rejected.
	connect := func(port int, path string) chan result {
		return background(`ip=$(nslookup example.test 2>/dev/null | awk '/^Address: 198\.18\./{print $2}'); [ -n "$ip" ] || exit 3; ` +
			fmt.Sprintf(`printf 'GET %s HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc -w 60 $ip %d`, path, port))
	}
	done = connect(7001, "/ask-held-tcp")
	stack.MustNexus(t, "egress", "approve", request(plainHost, 7001).ID, "--for", "10m")
	if res := wait(done); res.code != 0 || !strings.Contains(res.out, "hello from fake example.test") || len(upstreams[plainHost].find("/ask-held-tcp")) != 1 {
		t.Fatalf("a held connection after approve: exit %d %q", res.code, res.out)
	}
	done = connect(7002, "/ask-rejected-tcp")
	held := request(plainHost, 7002)
	// The request names the guest process that asked (reported by the guest agent).
	if err := testutil.Poll(20*time.Second, func() error {
		if r := request(plainHost, 7002); !strings.Contains(r.Cmdline, "nc -w 60") {
			return fmt.Errorf("the request's process is %q", r.Cmdline)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stack.MustNexus(t, "egress", "reject", held.ID)
	if res := wait(done); res.code == 0 || len(upstreams[plainHost].find("/ask-rejected-tcp")) != 0 {
		t.Fatalf("a held connection after reject: exit %d %q", res.code, res.out)
	}
	waitEvent(t, box, true, "ask_rejected", func(e audit.Event) bool {
		return e.Layer == audit.LayerL4 && e.Host == plainHost && e.Port == 7002 && e.Rule == "ask_rejected"
	})

	// Rejected (or unanswered): the held lookup fails and nothing reaches the host.
	before := upstreams["evil.example"].count()
	if out, _, code := sh(t, box, "nslookup evil.example"); code == 0 && strings.Contains(out, "198.18.") {
		t.Fatalf("an unapproved host resolved: %q", out)
	}
	waitEvent(t, box, true, "ask_timeout", func(e audit.Event) bool {
		return e.Layer == audit.LayerDNS && e.Host == "evil.example" && e.Rule == "ask_timeout"
	})
	if req, err := pending("evil.example"); err != nil {
		t.Fatal(err)
	} else {
		stack.MustNexus(t, "egress", "reject", req.ID)
	}
	if _, err := pending("evil.example"); err == nil {
		t.Error("the rejected request is still pending")
	}
	if upstreams["evil.example"].count() != before {
		t.Error("a request reached evil.example")
	}
	// nexus-why in the guest: this sandbox's own refusals with what would allow each, and a
	// request filed with a reason, shown as reported by the guest.
	out = mustSh(t, box, "nexus-why")
	for _, want := range []string{"sandbox egress/ask (egress curated, ask mode", "example.test (198.18.", "port 7002", "[ask_rejected]",
		"nexus egress allow egress/ask example.test:7002`", "nexus-why request example.test:7002"} {
		if !strings.Contains(out, want) {
			t.Fatalf("nexus-why lacks %q:\n%s", want, out)
		}
	}
	if out = mustSh(t, box, `nexus-why request docs.example:443 'need the SDK docs'`); !strings.Contains(out, "asked for docs.example:443") {
		t.Fatalf("nexus-why request printed %q", out)
	}
	filed := request("docs.example", 443)
	if filed.Reason != "need the SDK docs" {
		t.Fatalf("the filed request %+v", filed)
	}

	// A pending request survives a kill (-9) and restart of the whole stack (it is in the
	// sandbox's record) and can still be answered; so do other sandboxes' perimeters.
	kept := keepAcrossRestart(t)
	earlierLogs.WriteString(stack.Log()) // a restart starts a new log; keep this one for the leak scan
	start := time.Now()
	stack.Kill()
	if err := stack.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stack restarted in %.1fs", time.Since(start).Seconds())
	if after := request("docs.example", 443); after.ID != filed.ID || after.Reason != filed.Reason || !after.First.Equal(filed.First) {
		t.Fatalf("after a restart the request is %+v, was %+v", after, filed)
	}
	stack.MustNexus(t, "egress", "reject", filed.ID)
	kept()

	for _, rule := range []string{"egress_request", "egress_approve", "egress_reject"} {
		waitEvent(t, box, false, rule, func(e audit.Event) bool { return e.Rule == rule && e.Layer == audit.LayerPolicy })
	}
}
