package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// TestAskRequests: what an ask-mode sandbox's netstack reports becomes one pending request per
// host (counted again when repeated) in the record; approve grants it to the running netstack
// and drops it, reject drops it; a sandbox not in ask mode and a report under another
// sandbox's subject record nothing; everything is audited.
func TestAskRequests(t *testing.T) {
	b := testutil.NewBus(t)
	nc := b.Connect(t, bus.UserGateway)
	perim := startLivePerimeter(t, b.Connect(t, bus.UserAdmin))
	ns := b.Connect(t, bus.UserNetstack)
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
	if err := g.watchRequests(ctx); err != nil {
		t.Fatal(err)
	}
	add := func(name string, ask bool) *api.Sandbox {
		sb := &api.Sandbox{Name: name, Image: "nexus-mini", Host: bus.LocalHost, Egress: api.Egress{Mode: api.EgressCurated, Allow: []string{"api.anthropic.com:443,80"}, Ask: ask}}
		if err := reg.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	asker, plain := add("default/asker", true), add("default/plain", false)
	report := func(subjectID string, sb *api.Sandbox, host string) {
		data, _ := json.Marshal(netapi.EgressRequest{SandboxID: sb.ID, SandboxName: sb.Name, Host: host, Time: time.Now()})
		if err := ns.Publish(netapi.RequestSubjectPrefix+"."+subjectID, data); err != nil {
			t.Fatal(err)
		}
		ns.Flush()
	}
	report(asker.ID, asker, "docs.example.com")
	report(asker.ID, asker, "DOCS.example.com.")
	report(plain.ID, plain, "docs.example.com")
	report(plain.ID, asker, "spoofed.example.com")
	var pending []api.EgressRequest
	testutil.WaitFor(t, 10*time.Second, func() error {
		if pending, err = g.egressRequests(ctx, api.Empty{}); err != nil {
			return err
		}
		if len(pending) != 1 || pending[0].Count != 2 {
			return fmt.Errorf("pending %+v", pending)
		}
		return nil
	})
	r := pending[0]
	if r.Sandbox != asker.Name || r.Host != "docs.example.com" || r.First.IsZero() {
		t.Fatalf("request %+v", r)
	}
	if _, err := g.egressApprove(ctx, api.EgressAnswerRequest{ID: "r-nope"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("approve of an unknown id: %v", err)
	}
	ch, err := g.egressApprove(ctx, api.EgressAnswerRequest{ID: r.ID, Ports: []int{8443}, By: "carol", Via: "cli"})
	if err != nil || !slices.Equal(ch.Added, []string{"docs.example.com:8443"}) {
		t.Fatalf("approve: %+v %v", ch, err)
	}
	if got := rulesOf(perim.netPolicy(asker.ID)); !slices.Contains(got, "docs.example.com:8443") || !perim.netPolicy(asker.ID).Ask {
		t.Fatalf("netstack after approve: %+v", perim.netPolicy(asker.ID))
	}
	if pending, _ = g.egressRequests(ctx, api.Empty{}); len(pending) != 0 {
		t.Fatalf("still pending after approve: %+v", pending)
	}

	report(asker.ID, asker, "other.example.com")
	testutil.WaitFor(t, 10*time.Second, func() error {
		if pending, _ = g.egressRequests(ctx, api.Empty{}); len(pending) != 1 {
			return fmt.Errorf("pending %+v", pending)
		}
		return nil
	})
	// The netstack knows what is pending, so that a held connection ends at once on a reject.
	testutil.WaitFor(t, 5*time.Second, func() error {
		if p := perim.netPolicy(asker.ID).Pending; !slices.Equal(p, []string{"other.example.com"}) {
			return fmt.Errorf("netstack's pending %q", p)
		}
		return nil
	})
	if _, err := g.egressReject(ctx, api.EgressAnswerRequest{ID: pending[0].ID, By: "carol"}); err != nil {
		t.Fatal(err)
	}
	if pending, _ = g.egressRequests(ctx, api.Empty{}); len(pending) != 0 {
		t.Fatalf("still pending after reject: %+v", pending)
	}
	if p := perim.netPolicy(asker.ID).Pending; len(p) != 0 {
		t.Fatalf("netstack's pending after reject %q", p)
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		for _, rule := range []string{RuleEgressRequest, RuleEgressApprove, RuleEgressReject} {
			if len(perim.events(rule)) == 0 {
				return fmt.Errorf("no %s event", rule)
			}
		}
		return nil
	})
}
