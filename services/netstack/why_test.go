package netstack_test

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
)

// whyReport asks the network what would allow denials, as the gateway does for nexus-why.
func (e *env) whyReport(t *testing.T, denials []audit.Event) agentproto.WhyReport {
	t.Helper()
	r, err := e.svc.Why(sandboxID, netstackapi.WhyRequest{SandboxID: sandboxID, Denials: denials})
	if err != nil || r.Status != http.StatusOK || r.Report == nil {
		t.Fatalf("nexus-why: %+v %v", r, err)
	}
	return *r.Report
}

func (e *env) whyRequest(t *testing.T, req agentproto.WhyRequest) (int, string) {
	t.Helper()
	r, err := e.svc.Why(sandboxID, netstackapi.WhyRequest{SandboxID: sandboxID, Request: &req})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status, r.Message
}

func findDenial(rep agentproto.WhyReport, host string, port int) (agentproto.WhyDenial, bool) {
	for _, d := range rep.Denials {
		if d.Host == host && d.Port == port {
			return d, true
		}
	}
	return agentproto.WhyDenial{}, false
}

// nexus-why lists the refusals it is given (the gateway reads them from the audit stream, every
// layer) with what would allow each under the network's live policy; a request is filed only in
// ask mode.
func TestWhyListsRefusals(t *testing.T) {
	e := newEnv(t, curated(t))
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if _, err := e.guest.LookupA(ctx, "nope.test"); err == nil {
		t.Fatal("nope.test resolved")
	}
	ip := e.lookup(t, "api.test")
	if _, err := e.httpGet(t, netip.AddrPortFrom(ip, 9999), "api.test"); err == nil {
		t.Fatal("api.test:9999 connected")
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", Host: "api.test", Port: 9999, Decision: "deny"})
	var denials []audit.Event
	for _, ev := range e.log.all() {
		if ev.Decision == audit.Deny {
			denials = append(denials, ev)
		}
	}
	// The mitm's refusals are in the audit stream too.
	denials = append(denials,
		audit.Event{Layer: audit.LayerHTTP, Host: "api.test", Port: 443, Method: "POST", Path: "/admin", Decision: audit.Deny, Rule: "policy_path", Reason: "POST /admin is not allowed"},
		audit.Event{Layer: audit.LayerHTTP, Host: "other.test", Port: 443, Decision: audit.Deny, Rule: "placeholder_leak", Reason: "a placeholder was sent"})
	rep := e.whyReport(t, denials)
	if rep.Sandbox != "default/test" || rep.Mode != netstackapi.ModeCurated || rep.Ask {
		t.Fatalf("report %+v", rep)
	}
	if d, ok := findDenial(rep, "nope.test", 53); !ok || d.Layer != "dns" || !strings.Contains(d.Fix, "nexus egress allow default/test nope.test`") {
		t.Fatalf("the refused lookup: %+v in %+v", d, rep.Denials)
	}
	if d, ok := findDenial(rep, "api.test", 9999); !ok || !strings.Contains(d.Fix, "nexus egress allow default/test api.test:9999`") || strings.Contains(d.Fix, "nexus-why request") {
		t.Fatalf("the refused connection: %+v in %+v", d, rep.Denials)
	}
	if d, ok := findDenial(rep, "api.test", 443); !ok || d.Method != "POST" || d.Path != "/admin" || !strings.Contains(d.Fix, "egress.policy") || strings.Contains(d.Fix, "egress allow") {
		t.Fatalf("the refused request: %+v in %+v", d, rep.Denials)
	}
	if d, ok := findDenial(rep, "other.test", 443); !ok || !strings.HasPrefix(d.Fix, "nothing:") {
		t.Fatalf("the placeholder leak: %+v in %+v", d, rep.Denials)
	}
	// At most MaxWhyDenials, the newest.
	many := make([]audit.Event, 50)
	for i := range many {
		many[i] = audit.Event{Layer: "l4", Host: "api.test", Port: 1000 + i, Decision: audit.Deny}
	}
	if rep := e.whyReport(t, many); len(rep.Denials) != netstackapi.MaxWhyDenials || rep.Denials[len(rep.Denials)-1].Port != 1049 {
		t.Fatalf("%d denials, the last %+v", len(rep.Denials), rep.Denials[len(rep.Denials)-1])
	}
	if code, msg := e.whyRequest(t, agentproto.WhyRequest{Host: "nope.test"}); code != http.StatusConflict || !strings.Contains(msg, "not in ask mode") {
		t.Fatalf("a request off ask mode: %d %q", code, msg)
	}
	select {
	case r := <-e.requests:
		t.Fatalf("a request off ask mode was reported: %+v", r)
	default:
	}
}

// In ask mode a request is reported with its reason bounded and cleaned; an allowed host is
// not asked for.
func TestWhyRequestAskMode(t *testing.T) {
	e := newEnv(t, netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rules(t, "api.test:8080"), Ask: true})
	reason := "need\x1b[31m the\u202e SDK\ndocs " + strings.Repeat("x", 400)
	if code, msg := e.whyRequest(t, agentproto.WhyRequest{Host: "Docs.Example.com", Port: 443, Reason: reason}); code != http.StatusAccepted || !strings.Contains(msg, "nexus egress requests") {
		t.Fatalf("a request: %d %q", code, msg)
	}
	r := e.nextRequest(t)
	if r.Host != "docs.example.com" || r.Port != 443 || !strings.HasPrefix(r.Reason, "need[31m the SDK docs xxx") || len(r.Reason) > agentproto.MaxWhyReason {
		t.Fatalf("reported %+v", r)
	}
	if code, msg := e.whyRequest(t, agentproto.WhyRequest{Host: "api.test", Port: 8080}); code != http.StatusOK || !strings.Contains(msg, "allowed already") {
		t.Fatalf("a request for an allowed host: %d %q", code, msg)
	}
	if code, _ := e.whyRequest(t, agentproto.WhyRequest{Host: "bad host!"}); code != http.StatusBadRequest {
		t.Fatalf("a bad host: %d", code)
	}
}
