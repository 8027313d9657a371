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
}

type pubItem struct {
	subject string
	id      string
	data    []byte
	tries   int
}

// NewPublisher starts a publisher on nc. Events go to nexus.audit.egress.<Event.Sandbox>
// (the sandbox id).
func NewPublisher(nc *nats.Conn, log zerolog.Logger) (*Publisher, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, err
	}
	p := &Publisher{js: js, log: log, q: make(chan pubItem, QueueSize)}
	p.subject = func(ev Event) string { return Subject(subjectToken(ev.Sandbox)) }
	p.wg.Add(1)
	go p.run()
	return p, nil
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
	defer func() { recover() }() // Emit after Close: the event has nowhere to go
	p.q <- pubItem{subject: p.subject(ev), id: nuid.Next(), data: data}
}

func (p *Publisher) run() {
	defer p.wg.Done()
	var inflight sync.WaitGroup
	for it := range p.q {
		p.publish(it, &inflight)
	}
	inflight.Wait()
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

// Close publishes what is queued and waits for the acks, or until ctx ends.
func (p *Publisher) Close(ctx context.Context) error {
	p.once.Do(func() { close(p.q) })
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
