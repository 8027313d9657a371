package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// stream is the JetStream stream holding audit events (bus.StreamAudit; repeated here so that
// pkg/audit does not depend on pkg/bus).
const stream = "NEXUS_AUDIT"

// oneShotInactive is how long the server keeps the consumer of a read without Follow once
// nobody pulls from it.
const oneShotInactive = 30 * time.Second

// TailOptions selects events from the audit stream.
type TailOptions struct {
	Sandboxes []string  // sandbox ids; empty: all
	Since     time.Time // zero: from the start of the stream
	Denied    bool      // only denials
	Follow    bool      // keep waiting for new events until ctx ends
	// API selects the remote API's request events (layer api) instead of egress decisions;
	// Tokens then narrows them to requests made with these API tokens (names). Sandboxes do
	// not apply to them.
	API    bool
	Tokens []string
}

// Tail calls fn for every selected event in stream order: what is stored, then, with Follow,
// what arrives until ctx ends.
func Tail(ctx context.Context, nc *nats.Conn, o TailOptions, fn func(Event) error) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if !o.Follow {
		// A one-shot read's consumer goes away soon after it (nats.go deletes an ordered
		// consumer only when it resets it), even for a reader that may not delete consumers.
		cfg.InactiveThreshold = oneShotInactive
	}
	tokens := map[string]bool{}
	switch {
	case o.API && len(o.Tokens) == 0:
		cfg.FilterSubjects = []string{APISubjects}
	case o.API:
		for _, t := range o.Tokens {
			tokens[t] = true
			if s := Subject(APIService, APIKey(t)); !slices.Contains(cfg.FilterSubjects, s) {
				cfg.FilterSubjects = append(cfg.FilterSubjects, s)
			}
		}
	default:
		for _, id := range o.Sandboxes {
			cfg.FilterSubjects = append(cfg.FilterSubjects, SandboxSubjects(id)...)
		}
	}
	if !o.Since.IsZero() {
		since := o.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("audit: cannot read the %s stream: %w", stream, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	pending := info.NumPending
	if pending == 0 && !o.Follow {
		return nil
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for seen := uint64(0); o.Follow || seen < pending; {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("audit: %w", err)
		}
		seen++
		if IsAPISubject(m.Subject()) != o.API {
			continue // an API request among egress decisions, or the other way round
		}
		var ev Event
		if json.Unmarshal(m.Data(), &ev) != nil {
			continue
		}
		if o.Denied && ev.Decision != Deny || len(tokens) > 0 && !tokens[ev.Token] {
			continue
		}
		// The stream's time of an event copied from a single host's store into a cluster's
		// (bus.Migrate) is when it was copied: its own time says whether it is recent.
		if !o.Since.IsZero() && !ev.Time.IsZero() && ev.Time.Before(o.Since) {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}
