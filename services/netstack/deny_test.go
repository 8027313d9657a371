package netstack_test

import (
	"context"
	"net/netip"
	"testing"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
)

// An explicit deny (nexus egress deny) beats the allow rules, wildcards included: the name no
// longer resolves, an open connection to it is closed, and lifting the deny restores it.
func TestDenyBeatsAllowLive(t *testing.T) {
	st := startStreamServer(t)
	pol := netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rules(t, "*.stream.test:9000")}
	e := newEnv(t, pol, map[string]string{"a.stream.test": st.addr, "b.stream.test": st.addr})
	ip := e.lookup(t, "a.stream.test")
	cut := e.openStream(t, netip.AddrPortFrom(ip, 9000))
	kept := e.openStream(t, netip.AddrPortFrom(e.lookup(t, "b.stream.test"), 9000))
	cut.waitLines(t, 2)

	denied := pol
	denied.Deny = []string{"A.stream.test"}
	info, err := e.svc.UpdateNetwork(context.Background(), sandboxID, denied)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Rules) != 1 {
		t.Fatalf("rules after deny: %+v", info.Rules)
	}
	cut.waitEnd(t, "stream to the denied host")
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Host: "a.stream.test", Port: 9000, Decision: "deny", Rule: "policy_revoked",
		Reason: "open connection closed: host is denied (a.stream.test, nexus egress deny)"})
	ctx, cancel := context.WithTimeout(e.ctx, 2e9)
	defer cancel()
	if _, err := e.guest.LookupA(ctx, "a.stream.test"); err == nil {
		t.Fatal("a denied name resolved")
	}
	e.log.waitEvent(t, audit.Event{Layer: "dns", Host: "a.stream.test", Decision: "deny", Rule: "egress_deny"})
	kept.waitLines(t, 4)

	if _, err := e.svc.UpdateNetwork(context.Background(), sandboxID, pol); err != nil {
		t.Fatal(err)
	}
	e.lookup(t, "a.stream.test")
	if _, err := e.svc.UpdateNetwork(context.Background(), sandboxID, netstackapi.Policy{Mode: "curated", Deny: []string{"bad host"}}); err == nil {
		t.Fatal("an invalid deny pattern was accepted")
	}
}
