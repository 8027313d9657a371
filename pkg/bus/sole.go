package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"
)

// A sole service is one that must have a single serving instance on the whole bus, a cluster's
// included: the credbroker, whose secret store and minted placeholders live in one host's
// $NEXUS_HOME, so that a second instance answering half the requests would mint placeholders
// the first cannot resolve. An instance that finds none of its kind on the bus serves at once;
// one that finds others registers with micro (so `nexus status` shows it) without endpoints
// and stands by while an older one (by start time, then id) is there. Two that start at the
// same moment both serve for at most SoleEvery, then the younger stands by.

// SoleEvery is how often a standing-by instance looks again, and a serving one checks that no
// older one appeared (two started together, or a partition healed).
var SoleEvery = 2 * time.Second

// ServeSole is Serve for a sole service (see above). It blocks until ctx ends.
func ServeSole(ctx context.Context, nc *nats.Conn, info ServiceInfo, log zerolog.Logger, register func(*Service) error) error {
	for {
		// No responder is the bus's own immediate answer: nobody else is there.
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := nc.RequestWithContext(pctx, "$SRV.PING."+ServiceName(info.Name), nil)
		cancel()
		alone := errors.Is(err, nats.ErrNoResponders)
		if ctx.Err() != nil {
			return nil
		}
		svc, err := NewService(nc, info, log)
		if err != nil {
			return err
		}
		me := svc.svc.Info()
		if !alone && !waitOldest(ctx, nc, me, log) {
			svc.Stop()
			return nil
		}
		if register != nil {
			if err := register(svc); err != nil {
				svc.Stop()
				return err
			}
		}
		older := watchOlder(ctx, nc, me)
		svc.Stop()
		if older == nil {
			return nil
		}
		log.Warn().Str("service", info.Name).Str("other_host", older.Metadata[MetaHost]).
			Msg("another, older instance serves on the bus: this one stops serving and stands by")
	}
}

// waitOldest returns true once me is the oldest instance of its service on the bus, false if
// ctx ends first. It says once, and again when the holder changes, who it waits for.
func waitOldest(ctx context.Context, nc *nats.Conn, me micro.Info, log zerolog.Logger) bool {
	said := ""
	for wait := time.Duration(0); ; wait = SoleEvery {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		if !nc.IsConnected() {
			continue // who serves is unknown until the connection is back
		}
		older := oldestOther(ctx, nc, me)
		if older == nil {
			return ctx.Err() == nil
		}
		if said != older.ID {
			said = older.ID
			log.Warn().Str("service", me.Name).Str("serving_host", older.Metadata[MetaHost]).Str("serving_pid", older.Metadata[MetaPID]).
				Msg("standing by: another instance serves on the bus (one per bus: its store is on its host); this one serves if it goes away")
		}
	}
}

// watchOlder checks every SoleEvery for an instance older than me until ctx ends (nil) or
// one is found (returned).
func watchOlder(ctx context.Context, nc *nats.Conn, me micro.Info) *micro.Info {
	t := time.NewTicker(SoleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !nc.IsConnected() {
			continue
		}
		if o := oldestOther(ctx, nc, me); o != nil {
			return o
		}
	}
}

// oldestOther is the oldest instance of me's service that is older than me, or nil.
func oldestOther(ctx context.Context, nc *nats.Conn, me micro.Info) *micro.Info {
	var oldest *micro.Info
	for _, in := range instances(ctx, nc, me.Name, 200*time.Millisecond) {
		if in.ID == me.ID || !olderThan(in, me) {
			continue
		}
		if oldest == nil || olderThan(in, *oldest) {
			oldest = &in
		}
	}
	return oldest
}

// olderThan orders instances by their start time (MetaStarted, RFC 3339 in UTC, so the text
// orders as the time does), then by id.
func olderThan(a, b micro.Info) bool {
	sa, sb := a.Metadata[MetaStarted], b.Metadata[MetaStarted]
	if sa != sb {
		ta, ea := time.Parse(time.RFC3339Nano, sa)
		tb, eb := time.Parse(time.RFC3339Nano, sb)
		if ea == nil && eb == nil {
			return ta.Before(tb)
		}
	}
	return a.ID < b.ID
}
