package netstack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/services/netstack"
)

// whyClient talks to the network's nexus-why service from inside the guest.
func (e *env) whyClient() *http.Client {
	gw := netip.AddrPortFrom(netip.MustParseAddr(netstack.GatewayIP), agentproto.WhyPort)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return e.guest.DialTCP(ctx, gw)
		},
	}}
}

func (e *env) whyReport(t *testing.T) agentproto.WhyReport {
	t.Helper()
	resp, err := e.whyClient().Get("http://nexus-why" + agentproto.WhyPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep agentproto.WhyReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != 200 {
		t.Fatalf("nexus-why: %d %v", resp.StatusCode, err)
	}
	return rep
}

func (e *env) whyRequest(t *testing.T, req agentproto.WhyRequest) (int, string) {
	t.Helper()
	b, _ := json.Marshal(req)
	resp, err := e.whyClient().Post("http://nexus-why"+agentproto.WhyRequestPath, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a agentproto.WhyAnswer
	_ = json.NewDecoder(resp.Body).Decode(&a)
	return resp.StatusCode, a.Message
}

func findDenial(rep agentproto.WhyReport, host string, port int) (agentproto.WhyDenial, bool) {
	for _, d := range rep.Denials {
		if d.Host == host && d.Port == port {
			return d, true
		}
	}
	return agentproto.WhyDenial{}, false
}

// nexus-why, served on the gateway inside the sandbox's own network, lists that network's
// refusals with the command that would allow each; a request is filed only in ask mode.
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
	rep := e.whyReport(t)
	if rep.Sandbox != "default/test" || rep.Mode != netstackapi.ModeCurated || rep.Ask {
		t.Fatalf("report %+v", rep)
	}
	if d, ok := findDenial(rep, "nope.test", 53); !ok || d.Layer != "dns" || !strings.Contains(d.Fix, "nexus egress allow default/test nope.test`") {
		t.Fatalf("the refused lookup: %+v in %+v", d, rep.Denials)
	}
	if d, ok := findDenial(rep, "api.test", 9999); !ok || !strings.Contains(d.Fix, "nexus egress allow default/test api.test:9999`") || strings.Contains(d.Fix, "nexus-why request") {
		t.Fatalf("the refused connection: %+v in %+v", d, rep.Denials)
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
// not asked for; calls past the budget are refused.
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
	limited := false
	for range 20 {
		resp, err := e.whyClient().Get("http://nexus-why" + agentproto.WhyPath)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			limited = true
			break
		}
	}
	if !limited {
		t.Fatal("20 calls in a row were all answered")
	}
}
