package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// livePerimeter is a fake netstack and mitm that keep the last policy each was sent.
type livePerimeter struct {
	mu    sync.Mutex
	net   map[string]netapi.Policy
	lim   map[string]*netapi.Limits
	mitm  map[string]mitmapi.SetHostsRequest
	audit []audit.Event
}

func (p *livePerimeter) netPolicy(id string) netapi.Policy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.net[id]
}

func (p *livePerimeter) events(rule string) []audit.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []audit.Event
	for _, ev := range p.audit {
		if ev.Rule == rule {
			out = append(out, ev)
		}
	}
	return out
}

func startLivePerimeter(t *testing.T, nc *nats.Conn) *livePerimeter {
	t.Helper()
	p := &livePerimeter{net: map[string]netapi.Policy{}, lim: map[string]*netapi.Limits{}, mitm: map[string]mitmapi.SetHostsRequest{}}
	ok, _ := bus.EncodeOK(struct{}{})
	sub := func(subj string, fn func(m *nats.Msg)) {
		s, err := nc.Subscribe(subj, fn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Unsubscribe() })
	}
	sub(netapi.Update.Subject(bus.LocalHost), func(m *nats.Msg) {
		var r netapi.UpdateRequest
		json.Unmarshal(m.Data, &r)
		p.mu.Lock()
		p.net[r.SandboxID] = r.Policy
		p.lim[r.SandboxID] = r.Limits
		p.mu.Unlock()
		m.Respond(ok)
	})
	sub(mitmapi.SetHosts.Subject(bus.LocalHost), func(m *nats.Msg) {
		var r mitmapi.SetHostsRequest
		json.Unmarshal(m.Data, &r)
		p.mu.Lock()
		p.mitm[r.ID] = r
		p.mu.Unlock()
		m.Respond(ok)
	})
	sub(audit.Prefix+".gateway.>", func(m *nats.Msg) {
		var ev audit.Event
		json.Unmarshal(m.Data, &ev)
		p.mu.Lock()
		p.audit = append(p.audit, ev)
		p.mu.Unlock()
		if m.Reply != "" {
			m.Respond(nil)
		}
	})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return p
}

func rulesOf(p netapi.Policy) []string {
	var out []string
	for _, r := range p.Allow {
		out = append(out, r.String())
	}
	return out
}

// TestLiveEgress: allow, deny, revoke and apply change the record, reach the running netstack
// and mitm, and are audited with who and before/after; a grant ends on its own; modes without
// per-host rules and private addresses are refused.
func TestLiveEgress(t *testing.T) {
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
	add := func(name string, e api.Egress) *api.Sandbox {
		t.Helper()
		sb := &api.Sandbox{Name: name, Image: "nexus-mini", Host: bus.LocalHost, Egress: e}
		if err := reg.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	sb := add("default/live", api.Egress{Mode: api.EgressCurated, Allow: []string{"api.anthropic.com:443,80"}})
	req := func(host string, d time.Duration) api.EgressChangeRequest {
		return api.EgressChangeRequest{Name: sb.Name, Host: host, For: d, By: "alice\x1b[31m", Via: "cli"}
	}

	ch, err := g.egressAllow(ctx, req("docs.example.com", 0))
	if err != nil {
		t.Fatal(err)
	}
	if !ch.Live || !slices.Equal(ch.Added, []string{"docs.example.com:443,80"}) || len(ch.Removed) != 0 {
		t.Fatalf("allow: %+v", ch)
	}
	if got := rulesOf(perim.netPolicy(sb.ID)); !slices.Equal(got, []string{"api.anthropic.com:443,80", "docs.example.com:443,80"}) {
		t.Fatalf("netstack rules after allow: %v", got)
	}
	if h := perim.mitm[sb.ID].AllowedHosts; !slices.Contains(h, "docs.example.com") {
		t.Fatalf("mitm hosts after allow: %v", h)
	}
	rec, _ := reg.Get(ctx, sb.Name)
	if len(rec.Egress.Grants) != 1 || rec.Egress.Grants[0].By != "alice[31m via cli" || rec.Egress.Grants[0].At.IsZero() {
		t.Fatalf("recorded grant: %+v", rec.Egress.Grants)
	}

	// An explicit deny beats the profile's own host; an allow of a denied host is refused.
	if _, err := g.egressDeny(ctx, req("api.anthropic.com", 0)); err != nil {
		t.Fatal(err)
	}
	if d := perim.netPolicy(sb.ID).Deny; !slices.Equal(d, []string{"api.anthropic.com"}) {
		t.Fatalf("netstack deny: %v", d)
	}
	if d := perim.mitm[sb.ID].DeniedHosts; !slices.Equal(d, []string{"api.anthropic.com"}) {
		t.Fatalf("mitm deny: %v", d)
	}
	if _, err := g.egressAllow(ctx, req("api.anthropic.com", 0)); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("allow of a denied host: %v", err)
	}
	if _, err := g.egressDeny(ctx, req("api.anthropic.com:443", 0)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("deny with a port: %v", err)
	}
	ch, err = g.egressRevoke(ctx, req("api.anthropic.com", 0))
	if err != nil || len(perim.netPolicy(sb.ID).Deny) != 0 || !slices.Equal(ch.Removed, []string{"!api.anthropic.com"}) {
		t.Fatalf("revoke of the deny: %+v %v (net deny %v)", ch, err, perim.netPolicy(sb.ID).Deny)
	}
	if _, err := g.egressRevoke(ctx, req("api.anthropic.com", 0)); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "nexus egress deny") {
		t.Fatalf("revoke of a create-time host: %v", err)
	}
	if _, err := g.egressRevoke(ctx, req("docs.example.com", 0)); err != nil {
		t.Fatal(err)
	}
	if got := rulesOf(perim.netPolicy(sb.ID)); !slices.Equal(got, []string{"api.anthropic.com:443,80"}) {
		t.Fatalf("netstack rules after revoke: %v", got)
	}

	// A grant with --for ends on its own, pushed and audited.
	go g.watchGrants(ctx)
	start := time.Now()
	if _, err := g.egressAllow(ctx, req("brief.example.com:8443", 1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := rulesOf(perim.netPolicy(sb.ID)); slices.Contains(got, "brief.example.com:8443") {
			return fmt.Errorf("the expired grant is still pushed: %v", got)
		}
		if len(perim.events(RuleGrantExpired)) == 0 {
			return errors.New("no grant_expired event")
		}
		return nil
	})
	if d := time.Since(start); d < 1500*time.Millisecond {
		t.Fatalf("the grant ended after %v, before its time", d)
	}
	rec, _ = reg.Get(ctx, sb.Name)
	if len(rec.Egress.Grants) != 0 {
		t.Fatalf("the expired grant is still recorded: %+v", rec.Egress.Grants)
	}

	// Private addresses stay refused unless --allow-private named them.
	if _, err := g.egressAllow(ctx, req("10.1.2.3:5432", 0)); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "--allow-private") {
		t.Fatalf("a private address: %v", err)
	}
	priv := add("default/priv", api.Egress{Mode: api.EgressCurated, Allow: []string{"x.example"}, AllowPrivate: []string{"10.1.0.0/16"}})
	if _, err := g.egressAllow(ctx, api.EgressChangeRequest{Name: priv.Name, Host: "10.1.2.3:5432"}); err != nil {
		t.Fatalf("a private address inside --allow-private: %v", err)
	}

	none := add("default/none", api.Egress{Mode: api.EgressNone})
	if _, err := g.egressAllow(ctx, api.EgressChangeRequest{Name: none.Name, Host: "x.example"}); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "no network device") {
		t.Fatalf("egress none: %v", err)
	}
	open := add("default/open", api.Egress{Mode: api.EgressAllowAll, AllowAllUntil: time.Now().Add(time.Hour)})
	if _, err := g.egressAllow(ctx, api.EgressChangeRequest{Name: open.Name, Host: "x.example"}); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "already open") {
		t.Fatalf("allow-all: %v", err)
	}

	// apply: the config's hosts replace those of the config the sandbox was created with.
	oldCfg, err := config.Parse("old.yaml", []byte("version: 1\negress:\n  allow:\n    - old.example\n"))
	if err != nil {
		t.Fatal(err)
	}
	newCfg, err := config.Parse("new.yaml", []byte("version: 1\negress:\n  allow:\n    - new.example\n  limits:\n    max_conns: 64\n    dns_rate: 20\n"))
	if err != nil {
		t.Fatal(err)
	}
	proj := &api.Sandbox{Name: "default/proj", Image: "nexus-mini", Host: bus.LocalHost, Config: oldCfg,
		Egress: api.Egress{Mode: api.EgressCurated, Allow: []string{"api.anthropic.com:443,80", "old.example:443,80"}, Limits: netapi.Limits{DNSRate: 500}}}
	if err := reg.Create(ctx, proj); err != nil {
		t.Fatal(err)
	}
	dry, err := g.egressApply(ctx, api.EgressApplyRequest{Name: proj.Name, Config: newCfg, DryRun: true})
	if err != nil || !slices.Equal(dry.Added, []string{"new.example:443,80"}) || !slices.Equal(dry.Removed, []string{"old.example:443,80"}) {
		t.Fatalf("apply --dry-run: %+v %v", dry, err)
	}
	if got := rulesOf(perim.netPolicy(proj.ID)); len(got) != 0 {
		t.Fatalf("a dry run was pushed: %v", got)
	}
	if _, err := g.egressApply(ctx, api.EgressApplyRequest{Name: proj.Name, Config: newCfg, By: "bob", Via: "cli"}); err != nil {
		t.Fatal(err)
	}
	if got := rulesOf(perim.netPolicy(proj.ID)); !slices.Equal(got, []string{"api.anthropic.com:443,80", "new.example:443,80"}) {
		t.Fatalf("netstack rules after apply: %v", got)
	}
	// Its egress.limits change live too; a budget a create flag set (--dns-rate 500) stays.
	perim.mu.Lock()
	lim := perim.lim[proj.ID]
	perim.mu.Unlock()
	if lim == nil || *lim != (netapi.Limits{MaxConns: 64, DNSRate: 500}) {
		t.Fatalf("netstack limits after apply: %+v", lim)
	}

	// Every change was audited with who and before/after.
	testutil.WaitFor(t, 5*time.Second, func() error {
		for _, rule := range []string{RuleEgressAllow, RuleEgressDeny, RuleEgressRevoke, RuleGrantExpired, RuleEgressApply} {
			if len(perim.events(rule)) == 0 {
				return fmt.Errorf("no %s event", rule)
			}
		}
		return nil
	})
	ev := perim.events(RuleEgressAllow)[0]
	if ev.Layer != audit.LayerPolicy || ev.By != "alice[31m via cli" || ev.Before != "api.anthropic.com:443,80" ||
		ev.After != "api.anthropic.com:443,80 docs.example.com:443,80" || ev.Sandbox != sb.ID {
		t.Fatalf("allow event: %+v", ev)
	}
	if ev := perim.events(RuleEgressApply)[0]; ev.By != "bob via cli" || !strings.Contains(ev.After, "new.example") || strings.Contains(ev.After, "old.example") {
		t.Fatalf("apply event: %+v", ev)
	}
}
