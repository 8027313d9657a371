package egress_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// TestRestartKeepsPerimeter kills the whole stack (-9) and restarts it: running guests keep their
// network, their placeholders still resolve to the same real value, and an allow-all expiry is
// not reset.
func TestRestartKeepsPerimeter(t *testing.T) {
	real := randomToken("keep_real_")
	setSecret(t, "KEEP_TOKEN", real)
	const box, open = "egress/keep", "egress/keep-open"
	create(t, box, "nexus-base", "--secret", "KEEP_TOKEN@api.github.com")
	create(t, open, "nexus-mini", "--egress", "allow-all=10m")
	placeholders(t, box, "KEEP_TOKEN", "NEXUS_CRED_API_GITHUB_COM_TOKEN")
	show := func() api.EgressView {
		var v api.EgressView
		if err := json.Unmarshal([]byte(stack.MustNexus(t, "egress", "show", open, "--json")), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := show()
	if r := curl(t, box, `-H "Authorization: Bearer $KEEP_TOKEN" https://api.github.com/keep?case=before`); r.status != "200" {
		t.Fatalf("before restart: %+v", r)
	}

	start := time.Now()
	// Restart starts a new log; keep this one for the leak scan.
	earlierLogs.WriteString(stack.Log())
	stack.Kill()
	if err := stack.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stack restarted in %.1fs", time.Since(start).Seconds())

	err := testutil.Poll(60*time.Second, func() error {
		r := curl(t, box, `-H "Authorization: Bearer $KEEP_TOKEN" https://api.github.com/keep?case=after`)
		if r.status != "200" {
			return fmt.Errorf("curl after restart: %+v", r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := upstreams["api.github.com"].find("/keep?case=after"); len(got) == 0 || got[len(got)-1].Auth != "Bearer "+real {
		t.Fatalf("after restart the upstream saw %+v", got)
	}
	t.Logf("swap works again %.1fs after the kill", time.Since(start).Seconds())
	after := show()
	if !after.Egress.AllowAllUntil.Equal(before.Egress.AllowAllUntil) || after.Network == nil ||
		!after.Network.Expiry.Equal(before.Egress.AllowAllUntil) || after.Network.EffectiveMode != "allow-all" {
		t.Fatalf("allow-all after restart: record %v network %+v; before %v", after.Egress.AllowAllUntil, after.Network, before.Egress.AllowAllUntil)
	}
}
