package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/home"
)

// A full disk is survived, not prevented (issue 19). While $NEXUS_HOME has no space JetStream's
// writes fail and every store operation ends within StoreTimeout saying "the bus cannot write:
// no space left on $NEXUS_HOME" (StoreError). But a stream whose write failed keeps that error
// for as long as it is loaded (nats-server's filestore and stream remember their first write
// error and refuse every later write without answering), so the registry would stay unwritable
// after the space came back, until the bus was restarted. The store guard watches nats-server's
// log for a write that failed for want of space and, once the home has room again, restarts
// JetStream in place: the streams are loaded again from disk, with what they had stored before
// the failure, and accept writes. Clients keep their connection; KV watchers are ordered
// consumers and start again by themselves.
//
// A reserve held back for the bus does not work on every host: ext4's root-reserved blocks
// protect the bus only when QEMU runs unprivileged (a root-owned 9p mount makes it root), a
// reserve file released on ENOSPC is eaten by the retrying guests in seconds, and counting each
// disk's full size at admission defeats sparse disks.

// StoreRestartedSubject is where the bus says it restarted JetStream after a full disk. A KV
// watcher made before may take 15 s to notice its consumer is gone (ordered consumers find out
// by missed heartbeats), so a cache following a bucket watches this and starts its watch again.
const StoreRestartedSubject = EventsPrefix + ".bus.store"

// StoreRestarted is the event on StoreRestartedSubject.
type StoreRestarted struct {
	Message string    `json:"message"`
	Time    time.Time `json:"time"`
}

var (
	// storeGuardPoll is how often the guard looks at a failed store (a variable for tests).
	storeGuardPoll = time.Second
	// storeRestartFree is the free space the home must have again before JetStream is restarted:
	// restarting into a disk that is still full would only fail again.
	storeRestartFree uint64 = 16 << 20
)

// storeLog is nats-server's logger: errors go to the bus's log, and a write that failed for
// want of space marks the store as failed.
type storeLog struct {
	log    zerolog.Logger
	failed *atomic.Bool
}

func (l storeLog) note(level zerolog.Level, format string, v []any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "no space left") {
		l.failed.Store(true)
	}
	l.log.WithLevel(level).Str("component", "nats-server").Msg(msg)
}

func (l storeLog) Noticef(string, ...any)         {}
func (l storeLog) Debugf(string, ...any)          {}
func (l storeLog) Tracef(string, ...any)          {}
func (l storeLog) Warnf(format string, v ...any)  { l.note(zerolog.WarnLevel, format, v) }
func (l storeLog) Errorf(format string, v ...any) { l.note(zerolog.ErrorLevel, format, v) }
func (l storeLog) Fatalf(format string, v ...any) { l.note(zerolog.ErrorLevel, format, v) }

// guardStore restarts JetStream after a write failed for want of space, once the home has
// storeRestartFree again, until the server stops. Single-host buses only: a cluster node's
// JetStream is shut down by nats-server itself on a full disk and needs its peers to return.
func (s *Server) guardStore(failed *atomic.Bool, jsc server.JetStreamConfig) {
	t := time.NewTicker(storeGuardPoll)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if !failed.Load() || !roomAgain(s.home) {
			continue
		}
		failed.Store(false)
		if err := s.restartJetStream(jsc); err != nil {
			s.log.Error().Err(err).Msg("bus: JetStream could not be restarted after its disk had room again; restart the stack (`nexus down && nexus up`)")
			failed.Store(true)
			continue
		}
		msg := fmt.Sprintf("bus: a store write had failed for want of space on %s; there is room again, so JetStream was restarted and accepts writes", s.home)
		s.log.Warn().Msg(msg)
		s.announce(StoreRestartedSubject, StoreRestarted{Message: msg, Time: time.Now().UTC()})
	}
}

// announce publishes v on subject as the bus user, best effort.
func (s *Server) announce(subject string, v any) {
	nc, err := Connect(context.Background(), ConnectConfig{Home: s.home, User: UserBus, URL: s.url})
	if err != nil {
		s.log.Warn().Err(err).Str("subject", subject).Msg("bus: cannot announce")
		return
	}
	defer nc.Close()
	b, _ := json.Marshal(v)
	nc.Publish(subject, b)
	nc.Flush()
}

// restartJetStream loads every stream again from the store, clearing their write errors.
func (s *Server) restartJetStream(jsc server.JetStreamConfig) error {
	if s.ns.JetStreamEnabled() {
		if err := s.ns.ShutdownJetStream(); err != nil {
			return fmt.Errorf("stop jetstream: %w", err)
		}
	}
	return s.ns.EnableJetStream(&jsc)
}

// jetStreamConfig is the JetStream configuration nats-server starts with from o.
func jetStreamConfig(o *server.Options) server.JetStreamConfig {
	return server.JetStreamConfig{StoreDir: o.StoreDir, MaxMemory: o.JetStreamMaxMemory, MaxStore: o.JetStreamMaxStore,
		SyncInterval: o.SyncInterval, SyncAlways: o.SyncAlways, Strict: !o.NoJetStreamStrict, CompressOK: true}
}

// roomAgain says whether the home's filesystem has storeRestartFree free (false when it cannot tell).
func roomAgain(h home.Dir) bool {
	sp, err := h.Space()
	return err == nil && sp.Free >= storeRestartFree
}
