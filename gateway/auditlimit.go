package gateway

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// AuditLimitedFor is how long after its last `suppressed` summary a sandbox is flagged in
// `nexus ps` and `nexus egress show` as hitting its audit limit.
const AuditLimitedFor = 10 * time.Minute

// auditLimits returns the sandboxes among ids that hit their audit limit within
// AuditLimitedFor: one look at the stream's summary subjects, then the last summary of each
// sandbox that has any (almost always none). A stream that does not answer flags nobody.
func (g *Service) auditLimits(ctx context.Context, ids ...string) map[string]*api.AuditLimit {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	st, err := g.reg.js.Stream(ctx, bus.StreamAudit)
	if err != nil {
		return nil
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(audit.AllSuppressed))
	if err != nil {
		return nil
	}
	out := map[string]*api.AuditLimit{}
	for subject := range info.State.Subjects {
		id := audit.SandboxOfSubject(subject)
		if !want[id] {
			continue
		}
		m, err := st.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			continue
		}
		var ev audit.Event
		if json.Unmarshal(m.Data, &ev) != nil || time.Since(ev.Time) > AuditLimitedFor {
			continue
		}
		l := out[id]
		if l == nil {
			l = &api.AuditLimit{}
			out[id] = l
		}
		l.Suppressed += ev.Count
		if ev.Time.After(l.Last) {
			l.Last = ev.Time
		}
	}
	return out
}
