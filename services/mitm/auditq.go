package mitm

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/audit"
)

// maxPendingAudit bounds the events waiting for a slow sink. Beyond it events are counted as
// dropped and logged (the JetStream sink itself retries; this only guards memory when the sink is
// wedged).
const maxPendingAudit = 1 << 17

// auditBatchDelay is the pause after each batch handed to the sink.
const auditBatchDelay = 2 * time.Millisecond

// auditQueue hands events to the sink on its own goroutine, so a request never waits for the
// audit stream.
type auditQueue struct {
	sink audit.Sink
	log  zerolog.Logger

	mu      sync.Mutex
	cond    *sync.Cond
	pending []audit.Event
	closed  bool
	dropped int64
	done    chan struct{}
}

func newAuditQueue(sink audit.Sink, log zerolog.Logger) *auditQueue {
	q := &auditQueue{sink: sink, log: log, done: make(chan struct{})}
	q.cond = sync.NewCond(&q.mu)
	go q.run()
	return q
}

func (q *auditQueue) emit(ev audit.Event) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	if len(q.pending) >= maxPendingAudit {
		q.dropped++
		n := q.dropped
		q.mu.Unlock()
		if n == 1 || n%1000 == 0 {
			q.log.Error().Int64(logKeyDropped, n).Msg("audit sink is not keeping up: events dropped")
		}
		return
	}
	q.pending = append(q.pending, ev)
	q.mu.Unlock()
	q.cond.Signal()
}

func (q *auditQueue) run() {
	defer close(q.done)
	var batch []audit.Event
	for {
		q.mu.Lock()
		for len(q.pending) == 0 && !q.closed {
			q.cond.Wait()
		}
		if len(q.pending) == 0 && q.closed {
			q.mu.Unlock()
			return
		}
		batch, q.pending = q.pending, batch[:0]
		closed := q.closed
		q.mu.Unlock()
		for _, ev := range batch {
			q.sink.Emit(context.Background(), ev)
		}
		clear(batch)
		if !closed {
			// Let events gather: one wake-up per batch instead of one per request keeps the
			// audit goroutine off the proxy's hot path. Events still reach the sink within
			// milliseconds.
			time.Sleep(auditBatchDelay)
		}
	}
}

// close flushes what is pending to the sink and stops.
func (q *auditQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
	<-q.done
}
