package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

const (
	defaultAuditLimit = 100
	maxAuditLimit     = 1000
	// maxAuditScan bounds how many events one call reads from the stream.
	maxAuditScan = 200_000
)

type auditArgs struct {
	Name   string `json:"name"`
	Limit  int    `json:"limit"`
	Since  string `json:"since"`
	Denied bool   `json:"denied"`
}

// AuditResult holds a sandbox's most recent egress decisions, oldest first.
type AuditResult struct {
	Sandbox string        `json:"sandbox"`
	Events  []audit.Event `json:"events"`
}

// egressAudit reads the sandbox's subject of the NEXUS_AUDIT stream with a short-lived
// ephemeral consumer and keeps the last limit events.
func (s *Server) egressAudit(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a auditArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Name == "" {
		return nil, errdefs.Invalid("name is required")
	}
	limit := a.Limit
	if limit <= 0 {
		limit = defaultAuditLimit
	}
	limit = min(limit, maxAuditLimit)
	var since time.Time
	if a.Since != "" {
		d, err := time.ParseDuration(a.Since)
		if err != nil || d <= 0 {
			return nil, errdefs.Invalid("invalid since %q: use a duration like 15m or 24h", a.Since)
		}
		since = time.Now().Add(-d)
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	sb, err := c.Get(ctx, a.Name)
	if err != nil {
		return nil, err
	}
	events, err := readAudit(ctx, c.Conn(), sb.ID, since, a.Denied, limit)
	if err != nil {
		return nil, err
	}
	return AuditResult{Sandbox: sb.Name, Events: events}, nil
}

// readAudit returns the last limit events of sandbox id (every service's subject) newer than since.
func readAudit(ctx context.Context, nc *nats.Conn, id string, since time.Time, deniedOnly bool, limit int) ([]audit.Event, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("egress audit: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cfg := jetstream.ConsumerConfig{
		FilterSubjects:    audit.SandboxSubjects(id),
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := js.CreateConsumer(ctx, bus.StreamAudit, cfg)
	if err != nil {
		return nil, errdefs.Unavailable("egress audit: cannot read stream %s: %v", bus.StreamAudit, err)
	}
	info := cons.CachedInfo()
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		js.DeleteConsumer(dctx, bus.StreamAudit, info.Name)
		dcancel()
	}()
	pending := int(min(info.NumPending, maxAuditScan))
	ring := make([]audit.Event, 0, limit)
	start := 0 // index of the oldest kept event once the ring is full
	for read := 0; read < pending; {
		batch, err := cons.Fetch(min(pending-read, 500), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("egress audit: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			var ev audit.Event
			if json.Unmarshal(m.Data(), &ev) != nil {
				continue
			}
			// A copy from a single host's store (bus.Migrate) is as old as its own time says.
			if deniedOnly && ev.Decision != audit.Deny || !since.IsZero() && !ev.Time.IsZero() && ev.Time.Before(since) {
				continue
			}
			if len(ring) < limit {
				ring = append(ring, ev)
			} else {
				ring[start] = ev
				start = (start + 1) % limit
			}
		}
		if got == 0 {
			break
		}
		read += got
	}
	events := make([]audit.Event, 0, len(ring))
	events = append(events, ring[start:]...)
	events = append(events, ring[:start]...)
	return events, nil
}
