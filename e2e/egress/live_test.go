package egress_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/audit"
)

// TestLiveEgress changes the policy of one running nexus-mini sandbox (issue 26): an allow lets
// a connection through within a second, a revoke closes an open one, a 5 s grant ends on its
// own, a deny beats the sandbox's create-time host, a grant survives a stack restart, and every
// change is an audit event with who and before/after.
func TestLiveEgress(t *testing.T) {
	const box = "egress/live"
	create(t, box, "nexus-mini", "--allow-host", "api.github.com")
	up := upstreams[plainHost]
	// get resolves example.test in the guest (busybox nslookup takes seconds under TCG) and
	// sends one request; getIP sends it to the address resolved earlier, which the netstack
	// still maps to the name (its DNS table), so that it takes about as long as one exec.
	get := func(path string) (string, int) {
		out, _, code := sh(t, box, `ip=$(nslookup example.test 2>/dev/null | awk '/^Address: 198\.18\./{print $2}'); [ -n "$ip" ] || exit 3; `+
			`printf 'GET `+path+` HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc -w 5 $ip 7000`)
		return out, code
	}
	var ip string
	getIP := func(path string) (string, int) {
		out, _, code := sh(t, box, `printf 'GET `+path+` HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc -w 5 `+ip+` 7000`)
		return out, code
	}
	// Refused before any grant: nothing reaches the upstream, the DNS refusal is audited.
	before := up.count()
	if out, code := get("/live-before"); code == 0 || strings.Contains(out, "hello") {
		t.Fatalf("example.test reachable before a grant: %d %q", code, out)
	}
	waitEvent(t, box, true, "dns refusal of example.test", func(e audit.Event) bool {
		return e.Layer == audit.LayerDNS && e.Host == plainHost && e.Reason == "name is not on the allowlist"
	})
	if up.count() != before {
		t.Fatal("a request reached example.test before it was allowed")
	}

	// allow: the next connection goes through.
	out := stack.MustNexus(t, "egress", "allow", box, "example.test:7000")
	if !strings.Contains(out, "+ example.test:7000") || !strings.Contains(out, "applied to the running sandbox") {
		t.Fatalf("egress allow printed %q", out)
	}
	allowed := time.Now()
	if err := testutil.Poll(10*time.Second, func() error {
		if out, code := get("/live-allowed"); code != 0 || !strings.Contains(out, "hello from fake example.test") {
			return fmt.Errorf("after allow: exit %d %q", code, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("allowed host reachable %.2fs after egress allow returned", time.Since(allowed).Seconds())

	// revoke closes an open connection.
	ip = resolveMini(t, box, plainHost)
	done := make(chan struct{})
	go func() {
		sh(t, box, `printf 'GET /stream HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc `+ip+` 7000 > /tmp/stream`)
		close(done)
	}()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if openStreams.Load() == 0 {
			return errors.New("the stream did not reach the upstream")
		}
		return nil
	})
	stack.MustNexus(t, "egress", "revoke", box, "example.test")
	testutil.WaitFor(t, 15*time.Second, func() error {
		select {
		case <-done:
		default:
			return errors.New("the stream still flows after revoke")
		}
		if openStreams.Load() != 0 {
			return errors.New("the upstream side of the stream is still open")
		}
		return nil
	})
	waitEvent(t, box, true, "policy_revoked after revoke", func(e audit.Event) bool {
		return e.Rule == "policy_revoked" && e.Host == plainHost && e.Port == 7000
	})

	// A 5 s grant ends on its own.
	stack.MustNexus(t, "egress", "allow", box, "example.test:7000", "--for", "5s")
	granted := time.Now()
	if out, code := getIP("/live-brief"); code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("during a 5s grant (%.1fs after it): exit %d %q", time.Since(granted).Seconds(), code, out)
	}
	t.Logf("a connection %.2fs after egress allow returned went through (one exec)", time.Since(granted).Seconds())
	waitEvent(t, box, true, "grant_expired", func(e audit.Event) bool {
		return e.Rule == "grant_expired" && e.Layer == audit.LayerPolicy && !strings.Contains(e.After, "example.test")
	})
	before = up.count()
	if out, code := getIP("/live-expired"); code == 0 || strings.Contains(out, "hello") {
		t.Fatalf("reachable after the grant expired: %d %q", code, out)
	}
	waitEvent(t, box, true, "l4 refusal after expiry", func(e audit.Event) bool {
		return e.Layer == audit.LayerL4 && e.Host == plainHost && e.Port == 7000 && e.Reason == "port 7000 is not allowed for example.test"
	})
	if up.count() != before {
		t.Fatal("a request reached example.test after its grant expired")
	}

	// deny beats the create-time --allow-host.
	stack.MustNexus(t, "egress", "deny", box, "api.github.com")
	if out, _, code := sh(t, box, "nslookup api.github.com"); code == 0 && strings.Contains(out, "198.18.") {
		t.Fatalf("a denied host resolved: %q", out)
	}
	waitEvent(t, box, true, "dns egress_deny", func(e audit.Event) bool {
		return e.Layer == audit.LayerDNS && e.Host == "api.github.com" && e.Rule == "egress_deny"
	})
	stack.MustNexus(t, "egress", "revoke", box, "api.github.com")

	// A grant survives a restart of the whole stack, and still works.
	stack.MustNexus(t, "egress", "allow", box, "example.test:7000", "--for", "10m")
	earlierLogs.WriteString(stack.Log())
	stack.Kill()
	if err := stack.Restart(); err != nil {
		t.Fatal(err)
	}
	var view api.EgressView
	if err := json.Unmarshal([]byte(stack.MustNexus(t, "egress", "show", box, "--json")), &view); err != nil {
		t.Fatal(err)
	}
	if len(view.Egress.Grants) != 1 || view.Egress.Grants[0].Rule != "example.test:7000" || view.Egress.Grants[0].Until.IsZero() {
		t.Fatalf("grants after restart: %+v", view.Egress.Grants)
	}
	if err := testutil.Poll(60*time.Second, func() error {
		if out, code := get("/live-restarted"); code != 0 || !strings.Contains(out, "hello") {
			return fmt.Errorf("after restart: exit %d %q", code, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if show := stack.MustNexus(t, "egress", "show", box); !strings.Contains(show, "granted:  example.test:7000  by ") {
		t.Errorf("egress show does not list the grant:\n%s", show)
	}

	// Every change was audited with who and before/after.
	seen := map[string]bool{}
	for _, e := range events(t, box, false) {
		if e.Layer == audit.LayerPolicy {
			if e.By == "" || e.Before == "" || e.After == "" {
				t.Errorf("policy event without who or before/after: %+v", e)
			}
			seen[e.Rule] = true
		}
	}
	for _, r := range []string{"egress_allow", "egress_revoke", "egress_deny", "grant_expired"} {
		if !seen[r] {
			t.Errorf("no %s audit event (saw %v)", r, seen)
		}
	}
}
