package egress_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
)

// limitCount sums the refusals counted by a sandbox's aggregated events of one budget rule.
func limitCount(evs []audit.Event, rule string) int {
	total := 0
	for _, ev := range evs {
		var k int
		if ev.Rule == rule && ev.Decision == audit.Deny {
			if _, err := fmt.Sscanf(ev.Reason, "%d ", &k); err == nil {
				total += k
			}
		}
	}
	return total
}

// testEgressBudgets (a part of TestGuestFloodIsLimited, which lends its quiet sandbox as the
// neighbour): a sandbox created with --max-conns 2 --dns-rate 2 that floods is held to them,
// each refusal counted in aggregated audit events, while a neighbour with the default budgets
// (allowed example.test:8123) is served at the same time.
func testEgressBudgets(t *testing.T, neighbour string) {
	const flooder = "egress/budgeted"
	create(t, flooder, "nexus-mini", "--allow-host", plainHost+":8123", "--max-conns", "2", "--dns-rate", "2")
	if show := stack.MustNexus(t, "egress", "show", flooder); !strings.Contains(show, "limits:   2 connections, 500 new/s, 2 dns/s") {
		t.Fatalf("egress show:\n%s", show)
	}
	ip := resolveMini(t, neighbour, plainHost) // resolver-override addresses are the same in every sandbox

	// Two streams hold the flooder's two connections; five more are refused.
	out := mustSh(t, flooder, `get='GET /stream HTTP/1.0\r\nHost: example.test\r\n\r\n'
printf "$get" | nc `+ip+` 8123 > /tmp/s1 & a=$!
printf "$get" | nc `+ip+` 8123 > /tmp/s2 & b=$!
i=0; until [ -s /tmp/s1 ] && [ -s /tmp/s2 ]; do i=$((i+1)); [ $i -gt 300 ] && break; sleep 0.1; done
refused=0
for i in 1 2 3 4 5; do nc -w 5 `+ip+` 8123 </dev/null >/dev/null 2>&1 || refused=$((refused+1)); done
echo "refused=$refused"
kill $a $b; wait
t0=$(date +%s)
for i in $(seq 10); do nslookup example.test >/dev/null 2>&1 & done; wait
echo "dns_flood_s=$(($(date +%s)-t0))"`)
	if !strings.Contains(out, "refused=5") {
		t.Fatalf("connections past --max-conns 2 were not all refused: %q", out)
	}
	// The neighbour is served: its connections and its queries pass.
	if got := mustSh(t, neighbour, `printf 'GET /neighbour HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc -w 5 `+ip+` 8123`); !strings.Contains(got, "hello from fake example.test") {
		t.Fatalf("neighbour's request: %q", got)
	}
	mustSh(t, neighbour, "for i in 1 2 3; do nslookup example.test >/dev/null || exit 1; done")

	testutil.WaitFor(t, 20*time.Second, func() error {
		evs := events(t, flooder, true)
		if k := limitCount(evs, "max_conns"); k != 5 {
			return fmt.Errorf("max_conns events count %d refusals, want 5", k)
		}
		if limitCount(evs, "dns_rate") == 0 {
			return errors.New("no dns_rate event")
		}
		return nil
	})
	for _, ev := range events(t, neighbour, true) {
		if ev.Rule == "max_conns" || ev.Rule == "dns_rate" || ev.Rule == "conn_rate" {
			t.Errorf("the neighbour was limited: %+v", ev)
		}
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if openStreams.Load() != 0 {
			return errors.New("the flooder's streams are still open upstream")
		}
		return nil
	})
	t.Logf("flooder: %s", strings.ReplaceAll(strings.TrimSpace(out), "\n", ", "))
}
