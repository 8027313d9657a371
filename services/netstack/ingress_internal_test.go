package netstack

import (
	"strings"
	"testing"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
)

// Bytes to the guest are held to the ingress budget, apart from the egress one, and a delay is
// audited once per window with the bytes.
func TestIngressBucket(t *testing.T) {
	n, log := budgetNetwork(t, netstackapi.Limits{IngressBandwidth: 64 << 10})
	if b := n.budget.ingress.Burst(); b != 64<<10 {
		t.Fatalf("burst %d", b)
	}
	if d := n.budget.egress.Limit(); int64(d) != netstackapi.DefaultLimits.EgressBandwidth {
		t.Fatalf("egress budget %v, want the default", d)
	}
	var sink strings.Builder
	w := ingressWriter{n, &sink}
	if _, err := w.Write(make([]byte, 64<<10)); err != nil { // the burst: at once
		t.Fatal(err)
	}
	if n.budget.limited.Load() != 0 {
		t.Fatal("the first burst was held back")
	}
	if _, err := w.Write(make([]byte, 2<<10)); err != nil { // past it: waits for tokens
		t.Fatal(err)
	}
	if sink.Len() != 66<<10 {
		t.Fatalf("wrote %d bytes", sink.Len())
	}
	n.flushLimits()
	evs := log.all()
	if len(evs) != 1 || evs[0].Rule != RuleIngressBandwidth || evs[0].Decision != audit.Allow || evs[0].Bytes != 2<<10 ||
		!strings.Contains(evs[0].Reason, "ingress is held to 64 KiB per second (--ingress-bandwidth)") {
		t.Fatalf("events %+v", evs)
	}
}

func TestIngressLimitDefaultsAndValidation(t *testing.T) {
	if l := (netstackapi.Limits{}).WithDefaults(); l.IngressBandwidth != 100<<20 {
		t.Fatalf("default ingress %d, want 100 MiB/s", l.IngressBandwidth)
	}
	if err := (netstackapi.Limits{IngressBandwidth: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "--ingress-bandwidth -1 is negative") {
		t.Fatalf("negative ingress: %v", err)
	}
}
