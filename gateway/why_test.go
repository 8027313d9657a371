package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/agentproto"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// TestEgressWhy: nexus-why for a sandbox gets that sandbox's refusals of every layer from the
// audit stream (not another sandbox's, not policy changes, at most the newest 32) to its
// netstack, found by the id the vmm names; an egress none sandbox is answered without a
// netstack.
func TestEgressWhy(t *testing.T) {
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserGateway)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg, err := NewRegistry(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	g := &Service{cfg: Config{Bus: nc, Home: b.Home, Host: bus.LocalHost}, reg: reg, log: zerolog.Nop()}
	got := make(chan netapi.WhyRequest, 4)
	ns := b.Connect(t, bus.UserNetstack)
	sub, err := ns.Subscribe(netapi.Why.Subject(bus.LocalHost), func(m *nats.Msg) {
		var r netapi.WhyRequest
		json.Unmarshal(m.Data, &r)
		got <- r
		rep := agentproto.WhyReport{Sandbox: "from the netstack", Denials: []agentproto.WhyDenial{}}
		ok, _ := bus.EncodeOK(netapi.WhyReply{Status: http.StatusOK, Report: &rep})
		m.Respond(ok)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ns.Flush()
	add := func(name, mode string) *api.Sandbox {
		sb := &api.Sandbox{Name: name, Image: "nexus-mini", Host: bus.LocalHost, Egress: api.Egress{Mode: mode, Allow: []string{"api.test:443"}}}
		if mode == api.EgressNone {
			sb.Egress.Allow = nil
		}
		if err := reg.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	one, other, closed := add("default/one", api.EgressCurated), add("default/other", api.EgressCurated), add("default/closed", api.EgressNone)

	publish := func(service string, sb *api.Sandbox, ev audit.Event) {
		ev.Sandbox, ev.Name, ev.Time = sb.ID, sb.Name, time.Now().UTC()
		pub, err := audit.NewPublisher(b.Connect(t, service), service, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		pub.Emit(ctx, ev)
		if err := pub.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		publish(bus.UserNetstack, one, audit.Event{Layer: audit.LayerL4, Proto: "tcp", Host: "api.test", Port: 1000 + i, Decision: audit.Deny})
	}
	publish(bus.UserNetstack, one, audit.Event{Layer: audit.LayerL4, Host: "api.test", Port: 443, Decision: audit.Allow})
	publish(bus.UserMITM, one, audit.Event{Layer: audit.LayerHTTP, Host: "api.test", Port: 443, Method: "POST", Path: "/admin", Decision: audit.Deny, Rule: "policy_path"})
	publish(bus.UserGateway, one, audit.Event{Layer: audit.LayerPolicy, Host: "x.test", Decision: audit.Deny, Rule: RuleEgressRequest})
	publish(bus.UserNetstack, other, audit.Event{Layer: audit.LayerDNS, Host: "other.test", Port: 53, Decision: audit.Deny})

	var r netapi.WhyRequest
	testutil.WaitFor(t, 10*time.Second, func() error {
		reply, err := g.egressWhy(ctx, api.EgressWhyRequest{SandboxID: one.ID})
		if err != nil || reply.Report == nil || reply.Report.Sandbox != "from the netstack" {
			return fmt.Errorf("reply %+v %v", reply, err)
		}
		r = <-got
		if n := len(r.Denials); n != netapi.MaxWhyDenials || r.Denials[n-1].Layer != audit.LayerHTTP {
			return fmt.Errorf("%d denials forwarded", n)
		}
		return nil
	})
	if r.SandboxID != one.ID || r.Request != nil || r.Denials[0].Port != 1000+41-netapi.MaxWhyDenials {
		t.Fatalf("forwarded %s, first %+v", r.SandboxID, r.Denials[0])
	}
	for _, ev := range r.Denials {
		if ev.Sandbox != one.ID || ev.Decision != audit.Deny || ev.Layer == audit.LayerPolicy {
			t.Fatalf("forwarded %+v", ev)
		}
	}
	// A request goes to the netstack as it is, without the audit read.
	req := agentproto.WhyRequest{Host: "docs.test", Port: 443, Reason: "sdk"}
	if _, err := g.egressWhy(ctx, api.EgressWhyRequest{SandboxID: one.ID, Request: &req}); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.Request == nil || *r.Request != req || len(r.Denials) != 0 {
		t.Fatalf("forwarded %+v", r)
	}
	// An id no sandbox has.
	if _, err := g.egressWhy(ctx, api.EgressWhyRequest{SandboxID: "sb-nope"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an unknown id: %v", err)
	}
	reply, err := g.egressWhy(ctx, api.EgressWhyRequest{SandboxID: closed.ID})
	if err != nil || reply.Report == nil || reply.Report.Mode != api.EgressNone {
		t.Fatalf("egress none: %+v %v", reply, err)
	}
	if reply, err := g.egressWhy(ctx, api.EgressWhyRequest{SandboxID: closed.ID, Request: &req}); err != nil || reply.Status != http.StatusConflict {
		t.Fatalf("a request of an egress none sandbox: %+v %v", reply, err)
	}
	select {
	case r := <-got:
		t.Fatalf("the netstack was asked for %+v", r)
	default:
	}
}

// TestGuestTextLabelled: a request's guest-supplied reason is shown, listed and audited as
// reported by the guest, and one without any carries no label.
func TestGuestTextLabelled(t *testing.T) {
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserGateway)
	perim := startLivePerimeter(t, b.Connect(t, bus.UserAdmin))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg, err := NewRegistry(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := audit.NewPublisher(nc, bus.UserGateway, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	g := &Service{cfg: Config{Bus: nc, Home: b.Home, Host: bus.LocalHost}, reg: reg, log: zerolog.Nop(), audit: pub, grantWake: make(chan struct{}, 1)}
	sb := &api.Sandbox{Name: "default/asker", Image: "nexus-mini", Host: bus.LocalHost, Egress: api.Egress{Mode: api.EgressCurated, Allow: []string{"api.test:443"}, Ask: true}}
	if err := reg.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	for _, r := range []netapi.EgressRequest{
		{SandboxID: sb.ID, SandboxName: sb.Name, Host: "docs.test", Reason: "need the \x1b[2Jdocs"},
		{SandboxID: sb.ID, SandboxName: sb.Name, Host: "plain.test"},
	} {
		if err := g.recordRequest(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	list, err := g.egressRequests(ctx, api.Empty{})
	if err != nil || len(list) != 2 {
		t.Fatalf("%+v %v", list, err)
	}
	for _, r := range list {
		want := ""
		if r.Host == "docs.test" {
			want = api.GuestReportedNote
			if r.Reason != "need the [2Jdocs" {
				t.Errorf("reason %q", r.Reason)
			}
		}
		if r.GuestReported != want {
			t.Errorf("%s: labelled %q, want %q", r.Host, r.GuestReported, want)
		}
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		for _, ev := range perim.events(RuleEgressRequest) {
			if ev.Host == "docs.test" && strings.Contains(ev.Reason, `reason reported by the guest: "need the [2Jdocs"`) {
				return nil
			}
		}
		return fmt.Errorf("audit %+v", perim.events(RuleEgressRequest))
	})
}
