package egress_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// keepAcrossRestart sets up what a kill (-9) and restart of the whole stack must keep, and
// returns the check to run after it: running guests keep their network, their placeholders
// still resolve to the same real value, and an allow-all expiry is not reset. TestAskMode,
// which restarts the stack anyway, runs it (one restart for both).
func keepAcrossRestart(t *testing.T) (after func()) {
	t.Helper()
	real := randomToken("keep_real_")
	setSecret(t, "KEEP_TOKEN", real)
	const box, open = "egress/keep", "egress/keep-open"
	create(t, box, "nexus-mini", "--secret", "KEEP_TOKEN@api.github.com")
	create(t, open, "nexus-mini", "--egress", "allow-all=10m")
	installProbe(t, box)
	placeholders(t, box, "KEEP_TOKEN", "NEXUS_CRED_API_GITHUB_COM_TOKEN")
	ghIP := resolveMini(t, box, "api.github.com")
	// swap sends the placeholder to api.github.com (the probe fills it in inside the guest).
	swap := func(c string) (string, int) {
		out, errOut, code := sh(t, box, "probe http "+ghIP+" GET 'https://api.github.com/keep?case="+c+"' - 'Authorization: Bearer {raw:KEEP_TOKEN}'")
		return out + errOut, code
	}
	show := func() api.EgressView {
		var v api.EgressView
		if err := json.Unmarshal([]byte(stack.MustNexus(t, "egress", "show", open, "--json")), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := show()
	if out, code := swap("before"); code != 0 || !strings.Contains(out, "status 200") {
		t.Fatalf("before restart: exit %d %q", code, out)
	}
	return func() {
		t.Helper()
		start := time.Now()
		err := testutil.Poll(60*time.Second, func() error {
			if out, code := swap("after"); code != 0 || !strings.Contains(out, "status 200") {
				return fmt.Errorf("after restart: exit %d %q", code, out)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := upstreams["api.github.com"].find("/keep?case=after"); len(got) == 0 || got[len(got)-1].Auth != "Bearer "+real {
			t.Fatalf("after restart the upstream saw %+v", got)
		}
		t.Logf("swap works again %.1fs after the restart", time.Since(start).Seconds())
		after := show()
		if !after.Egress.AllowAllUntil.Equal(before.Egress.AllowAllUntil) || after.Network == nil ||
			!after.Network.Expiry.Equal(before.Egress.AllowAllUntil) || after.Network.EffectiveMode != "allow-all" {
			t.Fatalf("allow-all after restart: record %v network %+v; before %v", after.Egress.AllowAllUntil, after.Network, before.Egress.AllowAllUntil)
		}
	}
}
