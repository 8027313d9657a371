package netstack_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
)

// Ask mode: a query for a name off the list is held; approved meanwhile it is answered, and
// otherwise it fails (SERVFAIL) after AskHold, audited as ask_timeout.
func TestAskHoldsDNSUntilApproved(t *testing.T) {
	pol := netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rules(t, "api.test:8080"), Ask: true}
	e := newEnv(t, pol)
	approved := make(chan error, 1)
	go func() {
		r := <-e.requests // the query is held: a person approves
		if r.Host != "web.test" || r.SandboxID != sandboxID {
			approved <- fmt.Errorf("request %+v", r)
			return
		}
		next := pol
		next.Allow = rules(t, "api.test:8080", "web.test")
		_, err := e.svc.UpdateNetwork(context.Background(), sandboxID, next)
		approved <- err
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	ips, err := e.guest.LookupA(ctx, "web.test")
	if err != nil || len(ips) == 0 {
		t.Fatalf("a query approved while held: %v %v", ips, err)
	}
	if err := <-approved; err != nil {
		t.Fatal(err)
	}
	e.log.waitEvent(t, audit.Event{Layer: "dns", Host: "web.test", Decision: "allow"})

	start := time.Now()
	if _, err := e.guest.LookupA(ctx, "cdn.test"); err == nil {
		t.Fatal("a query nobody approved was answered")
	}
	e.log.waitEvent(t, audit.Event{Layer: "dns", Host: "cdn.test", Decision: "deny", Rule: "ask_timeout"})
	t.Logf("unapproved query failed after %v", time.Since(start).Round(100*time.Millisecond))
}
