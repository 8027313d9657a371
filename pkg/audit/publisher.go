package audit

import (
	"context"
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
	service string
	limits  Limits
	lim     *limiter // nil: unlimited
	spool   *spool   // nil: events live only in memory until acknowledged
	stop    chan struct{}
	key     func(Event) string // the last subject token; nil: the sandbox id
}

// Option configures a publisher.
type Option func(*Publisher)

// WithLimits sets the per-sandbox limits (DefaultLimits otherwise; Unlimited for none).
func WithLimits(l Limits) Option { return func(p *Publisher) { p.limits = l } }

// WithKey files each event under nexus.audit.<service>.<key(ev)> instead of its sandbox id
// (the API's requests: APIKey of the token).
func WithKey(key func(Event) string) Option { return func(p *Publisher) { p.key = key } }

type pubItem struct {
	subject string
	id      string
	data    []byte
	tries   int
	spooled bool // already in the spool (read back at start)
}

// NewPublisher starts the publisher of service on nc. Events go to
// nexus.audit.<service>.<Event.Sandbox> (the sandbox id), within the per-sandbox limits.
func NewPublisher(nc *nats.Conn, service string, log zerolog.Logger, opts ...Option) (*Publisher, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, err
	}
	p := &Publisher{js: js, log: log, service: service, limits: DefaultLimits, q: make(chan pubItem, QueueSize), stop: make(chan struct{})}
	for _, o := range opts {
		o(p)
	}
	p.wg.Add(1)
	go p.run()
	if p.limits.Rate > 0 {
		p.lim = newLimiter(p.limits, p.write)
		p.wg.Add(1)
		go p.ticks()
	}
	return p, nil
}

// ticks writes folded events and summaries as they fall due, and all that is pending when the
// publisher closes.
func (p *Publisher) ticks() {
	defer p.wg.Done()
	every := max(p.limits.Window/4, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			p.lim.tick(time.Now(), true)
			close(p.q)
			return
		case <-t.C:
			p.lim.tick(time.Now(), false)
		}
	}
}

// NewSpooledPublisher is NewPublisher with a write-ahead spool file at path (one publisher per
// file): events are on disk before they are published, and the ones a previous publisher on the
// same file never got acknowledged are published again first.
func NewSpooledPublisher(nc *nats.Conn, service string, log zerolog.Logger, path string, opts ...Option) (*Publisher, error) {
	sp, left, err := openSpool(path, service)
	if err != nil {
		return nil, err
	}
	p, err := NewPublisher(nc, service, log, opts...)
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

// Emit implements Sink: the event is written now, folded into an identical one written
// within the window, or counted in the sandbox's next `suppressed` summary (Limits).
func (p *Publisher) Emit(_ context.Context, ev Event) {
	now := time.Now()
	if ev.Time.IsZero() {
		ev.Time = now.UTC()
	}
	clip(&ev)
	ev.Count, ev.First, ev.Last = 0, nil, nil
	if p.lim != nil && !p.lim.admit(ev, now) {
		return
	}
	p.write(ev, false)
}

// write queues one event for publishing: a decision on its sandbox's subject, a summary on
// the sandbox's suppressed subject.
func (p *Publisher) write(ev Event, summary bool) {
	data, err := marshal(ev)
	if err != nil {
		return
	}
	key := ev.Sandbox
	if p.key != nil {
		key = p.key(ev)
	}
	subject := Subject(p.service, key)
	if summary {
		subject = SuppressedSubject(p.service, key)
	}
	p.enqueue(pubItem{subject: subject, id: nuid.Next(), data: data})
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
	p.once.Do(func() {
		close(p.stop)
		if p.lim == nil {
			close(p.q)
		} // else ticks writes what is pending, then closes the queue
	})
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
