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
// rejected, the held lookup fails as it would have and nothing reaches the host.
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

	// The guest keeps asking (as a resolver retries); a person approves meanwhile.
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		out, _, code := sh(t, box, `for i in 1 2 3 4 5 6 7 8; do ip=$(nslookup example.test 2>/dev/null | awk '/^Address: 198\.18\./{print $2}'); `+
			`[ -n "$ip" ] && break; done; [ -n "$ip" ] || exit 3; printf 'GET /ask-approved HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc -w 5 $ip 7000`)
		done <- result{out, code}
	}()
	var req api.EgressRequest
	if err := testutil.Poll(30*time.Second, func() (err error) { req, err = pending(plainHost); return err }); err != nil {
		t.Fatal(err)
	}
	out := stack.MustNexus(t, "egress", "approve", req.ID, "--port", "7000", "--for", "10m")
	if !strings.Contains(out, "+ example.test:7000") {
		t.Fatalf("egress approve printed %q", out)
	}
	var res result
	testutil.WaitFor(t, 90*time.Second, func() error {
		select {
		case res = <-done:
			return nil
		default:
			return fmt.Errorf("the guest's lookup has not finished")
		}
	})
	if res.code != 0 || !strings.Contains(res.out, "hello from fake example.test") || len(upstreams[plainHost].find("/ask-approved")) != 1 {
		t.Fatalf("after approve: exit %d %q", res.code, res.out)
	}
	if _, err := pending(plainHost); err == nil {
		t.Error("the approved request is still pending")
	}

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
	for _, rule := range []string{"egress_request", "egress_approve", "egress_reject"} {
		waitEvent(t, box, false, rule, func(e audit.Event) bool { return e.Rule == rule && e.Layer == audit.LayerPolicy })
	}
}
