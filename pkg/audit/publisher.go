package audit

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
)

// QueueSize bounds events waiting to be published; past it Emit waits (backpressure) rather
// than lose an audit record.
const QueueSize = 1 << 16

// Publisher is the JetStream Sink: Emit queues the event and returns at once; a worker publishes
// asynchronously, tracks every ack and republishes what was not acknowledged (with the same
// message id, so the stream's duplicate window drops a retry that did land).
type Publisher struct {
	js      jetstream.JetStream
	log     zerolog.Logger
	q       chan pubItem
	wg      sync.WaitGroup
	once    sync.Once
	subject func(Event) string
	spool   *spool // nil: events live only in memory until acknowledged
	stop    chan struct{}
}

type pubItem struct {
	subject string
	id      string
	data    []byte
	tries   int
	spooled bool // already in the spool (read back at start)
}

// NewPublisher starts a publisher on nc. Events go to nexus.audit.egress.<Event.Sandbox>
// (the sandbox id).
func NewPublisher(nc *nats.Conn, log zerolog.Logger) (*Publisher, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, err
	}
	p := &Publisher{js: js, log: log, q: make(chan pubItem, QueueSize), stop: make(chan struct{})}
	p.subject = func(ev Event) string { return Subject(subjectToken(ev.Sandbox)) }
	p.wg.Add(1)
	go p.run()
	return p, nil
}

// NewSpooledPublisher is NewPublisher with a write-ahead spool file at path (one publisher per
// file): events are on disk before they are published, and the ones a previous publisher on the
// same file never got acknowledged are published again first.
func NewSpooledPublisher(nc *nats.Conn, log zerolog.Logger, path string) (*Publisher, error) {
	sp, left, err := openSpool(path)
	if err != nil {
		return nil, err
	}
	p, err := NewPublisher(nc, log)
	if err != nil {
		sp.close()
		return nil, err
	}
	p.spool = sp
	if len(left) > 0 {
		log.Info().Int("events", len(left)).Msg("audit: publishing events a previous run left unacknowledged")
	}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		for _, it := range left {
			it.spooled = true
			p.enqueue(it)
		}
	}()
	go p.flushAcks()
	return p, nil
}

// flushAcks writes buffered acknowledgements to the spool now and then.
func (p *Publisher) flushAcks() {
	defer p.wg.Done()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			if err := p.spool.flush(); err != nil {
				p.log.Warn().Err(err).Msg("audit spool")
			}
		}
	}
}

// enqueue hands it to the worker. After Close there is none: a new event is dropped, a spooled
// one stays in the spool for the next run.
func (p *Publisher) enqueue(it pubItem) {
	defer func() { recover() }()
	p.q <- it
}

// subjectToken keeps a subject token free of separators and wildcards.
func subjectToken(s string) string {
	if s == "" {
		return "unknown"
	}
	b := []byte(s)
	for i, c := range b {
		switch c {
		case '.', '*', '>', ' ', '\t', '\r', '\n', '/':
			b[i] = '_'
		}
	}
	return string(b)
}

// Emit implements Sink.
func (p *Publisher) Emit(_ context.Context, ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return
	}
	p.enqueue(pubItem{subject: p.subject(ev), id: nuid.Next(), data: data})
}

// maxBatch bounds the events spooled with one write.
const maxBatch = 512

// run is the first stage: it writes each batch to the spool and hands it to the second stage,
// which publishes. The stages are apart so that a bus that is down (publish retrying) never
// holds events back from the spool: they reach the disk while the retries go on.
func (p *Publisher) run() {
	defer p.wg.Done()
	out := make(chan pubItem, QueueSize)
	published := make(chan struct{})
	go func() {
		defer close(published)
		var inflight sync.WaitGroup
		for it := range out {
			p.publish(it, &inflight)
		}
		inflight.Wait()
	}()
	batch := make([]pubItem, 0, maxBatch)
	for it := range p.q {
		batch = append(batch[:0], it)
	more:
		for len(batch) < maxBatch {
			select {
			case it, ok := <-p.q:
				if !ok {
					break more
				}
				batch = append(batch, it)
			default:
				break more
			}
		}
		if p.spool != nil {
			var fresh []pubItem
			for _, it := range batch {
				if !it.spooled {
					fresh = append(fresh, it)
				}
			}
			if err := p.spool.append(fresh); err != nil {
				p.log.Warn().Err(err).Msg("audit spool: events are in memory only until acknowledged")
			}
		}
		for _, it := range batch {
			out <- it
		}
	}
	close(out)
	<-published
}

func (p *Publisher) publish(it pubItem, inflight *sync.WaitGroup) {
	for {
		fut, err := p.js.PublishAsync(it.subject, it.data, jetstream.WithMsgID(it.id))
		if err != nil {
			it.tries++
			p.backoff(it)
			continue
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			select {
			case <-fut.Ok():
				if p.spool != nil {
					p.spool.ack(it.id)
				}
			case err := <-fut.Err():
				it.tries++
				if it.tries == 1 || it.tries%20 == 0 {
					p.log.Warn().Err(err).Int("tries", it.tries).Str("subject", it.subject).Msg("audit event not acknowledged; retrying")
				}
				p.backoff(it)
				p.publish(it, inflight)
			}
		}()
		return
	}
}

func (p *Publisher) backoff(it pubItem) {
	d := time.Duration(min(it.tries, 20)) * 50 * time.Millisecond
	time.Sleep(d)
}

// Close publishes what is queued and waits for the acks, or until ctx ends. With a spool, what
// was not acknowledged by then stays in it for the next run.
func (p *Publisher) Close(ctx context.Context) error {
	p.once.Do(func() { close(p.q); close(p.stop) })
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		if p.spool != nil {
			return p.spool.close()
		}
		return nil
	case <-ctx.Done():
		if p.spool != nil {
			p.spool.close() // what is unacknowledged stays in it for the next run
		}
		return ctx.Err()
	}
}
