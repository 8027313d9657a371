package gateway

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestAuditLimitedIsFlagged: a sandbox over its audit rate (its netstack wrote `suppressed`
// summaries for it) is flagged in ps and egress show; the others are not.
func TestAuditLimitedIsFlagged(t *testing.T) {
	tg := newTestGateway(t)
	ctx, g := tg.ctx, tg.Service
	flood := tg.add(t, &api.Sandbox{Name: "default/flood"}, api.StateCreated)
	quiet := tg.add(t, &api.Sandbox{Name: "default/quiet"}, api.StateCreated)
	p, err := audit.NewPublisher(tg.bus.Connect(t, bus.UserNetstack), bus.UserNetstack, zerolog.Nop(),
		audit.WithLimits(audit.Limits{Rate: 1, Burst: 1, Window: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		p.Emit(ctx, audit.Event{Sandbox: flood.ID, Layer: audit.LayerDNS, Port: i, Decision: audit.Deny})
	}
	p.Emit(ctx, audit.Event{Sandbox: quiet.ID, Layer: audit.LayerDNS, Decision: audit.Deny})
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := g.list(ctx, api.ListRequest{All: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range list {
		switch v.Name {
		case flood.Name:
			if v.AuditLimited == nil || v.AuditLimited.Suppressed != 19 || time.Since(v.AuditLimited.Last) > time.Minute {
				t.Errorf("ps: the flooder is not flagged: %+v", v.AuditLimited)
			}
		case quiet.Name:
			if v.AuditLimited != nil {
				t.Errorf("ps: the quiet sandbox is flagged: %+v", v.AuditLimited)
			}
		}
	}
	v, err := g.egressShow(ctx, api.NameRequest{Name: flood.Name})
	if err != nil {
		t.Fatal(err)
	}
	if v.AuditLimited == nil {
		t.Error("egress show: the flooder is not flagged")
	}
}
