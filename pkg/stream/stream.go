// Package stream carries a long-lived, two-way byte session over the bus: exec output and
// input, attach, log following. Each direction has its own subject
// (nexus.stream.<sid>.out from the service, nexus.stream.<sid>.in from the client), every
// message a sequence number, and data flows only against credit the receiver granted, so a slow
// reader slows the guest process instead of filling memory. Heartbeats tell each side when the
// other is gone (a killed CLI ends its guest process).
package stream

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/IniZio/nexus/pkg/bus"
)

// Message kinds. Data kinds consume credit; the others do not.
const (
	KindStdout     = "stdout"
	KindStderr     = "stderr"
	KindStdin      = "stdin"
	KindStdinClose = "stdin-close"
	KindResize     = "resize"
	KindSignal     = "signal"
	KindExit       = "exit"
	KindError      = "error"
	kindCredit     = "credit"
	kindPing       = "ping"
	kindClose      = "close"
)

const (
	hdrSeq  = "Nexus-Seq"
	hdrKind = "Nexus-Kind"

	// MaxChunk is the largest data payload of one message.
	MaxChunk = 64 << 10
	// Window is the credit a receiver grants up front and tops up as it consumes.
	Window = 4 << 20
)

// Timing of liveness; variables so tests can shorten them.
var (
	PingEvery = time.Second
	PeerGone  = 10 * time.Second
)

// ErrPeerGone means the other side stopped answering.
var ErrPeerGone = errors.New("stream: the other side is gone")

// ErrClosed means the session was closed.
var ErrClosed = errors.New("stream: closed")

// Msg is one received message.
type Msg struct {
	Kind string
	Data []byte
}

// Session is one side of a stream.
type Session struct {
	nc      *nats.Conn
	send    string
	sub     *nats.Subscription
	in      chan *nats.Msg
	out     chan Msg
	mu      sync.Mutex
	cond    *sync.Cond
	seq     uint64 // last sent
	credit  int64  // bytes we may still send
	closed  bool
	err     error
	done    chan struct{}
	once    sync.Once
	pending int64 // bytes consumed but not yet returned as credit
	ping    time.Duration
	gone    time.Duration
}

// NewID returns a fresh session id.
func NewID() string { return nuid.Next() }

// OutSubject and InSubject name the two directions of session sid.
func OutSubject(sid string) string { return bus.StreamPrefix + "." + sid + ".out" }
func InSubject(sid string) string  { return bus.StreamPrefix + "." + sid + ".in" }

// Client opens the client side of sid: it receives on .out and sends on .in. Open it before
// asking the service to start, so nothing the service sends is missed.
func Client(nc *nats.Conn, sid string) (*Session, error) {
	return open(nc, InSubject(sid), OutSubject(sid))
}

// Server opens the service side of sid: it receives on .in and sends on .out.
func Server(nc *nats.Conn, sid string) (*Session, error) {
	return open(nc, OutSubject(sid), InSubject(sid))
}

func open(nc *nats.Conn, send, recv string) (*Session, error) {
	s := &Session{nc: nc, send: send, in: make(chan *nats.Msg, 1024), out: make(chan Msg, 64), credit: Window, done: make(chan struct{}),
		ping: PingEvery, gone: PeerGone}
	s.cond = sync.NewCond(&s.mu)
	sub, err := nc.ChanSubscribe(recv, s.in)
	if err != nil {
		return nil, fmt.Errorf("stream: subscribe: %w", err)
	}
	// The window bounds data in flight; allow it plus control messages without slow-consumer drops.
	sub.SetPendingLimits(-1, 4*Window)
	s.sub = sub
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("stream: %w", err)
	}
	go s.loop()
	return s, nil
}

// loop reads the subscription in order, checks sequence numbers, applies credit and liveness,
// and hands messages to Recv.
func (s *Session) loop() {
	defer close(s.out)
	tick := time.NewTicker(s.ping)
	defer tick.Stop()
	var expect uint64 = 1
	last := time.Now()
	for {
		select {
		case m := <-s.in:
			last = time.Now()
			kind := m.Header.Get(hdrKind)
			switch kind {
			case kindPing:
				continue
			case kindCredit:
				n, _ := strconv.ParseInt(string(m.Data), 10, 64)
				if n > 0 && n <= 4*Window {
					s.mu.Lock()
					s.credit += n
					s.cond.Broadcast()
					s.mu.Unlock()
				}
				continue
			}
			seq, _ := strconv.ParseUint(m.Header.Get(hdrSeq), 10, 64)
			if seq != expect {
				s.fail(fmt.Errorf("stream: message %d lost (got %d)", expect, seq))
				return
			}
			expect++
			if kind == kindClose {
				s.fail(ErrClosed)
				return
			}
			select {
			case s.out <- Msg{Kind: kind, Data: m.Data}:
			case <-s.done:
				return
			}
		case <-tick.C:
			if time.Since(last) > s.gone {
				s.fail(ErrPeerGone)
				return
			}
			s.control(kindPing, nil, false)
		case <-s.done:
			return
		}
	}
}

// Recv returns the next message; data messages return their size as credit to the sender.
func (s *Session) Recv() (Msg, error) {
	m, ok := <-s.out
	if !ok {
		s.mu.Lock()
		defer s.mu.Unlock()
		return Msg{}, s.err
	}
	if isData(m.Kind) {
		s.mu.Lock()
		s.pending += int64(len(m.Data))
		grant := s.pending
		if grant >= Window/4 {
			s.pending = 0
		}
		s.mu.Unlock()
		if grant >= Window/4 {
			s.control(kindCredit, []byte(strconv.FormatInt(grant, 10)), false)
		}
	}
	return m, nil
}

func isData(kind string) bool {
	return kind == KindStdout || kind == KindStderr || kind == KindStdin
}

// Write sends data of kind in chunks, waiting for credit; it is safe for concurrent use.
func (s *Session) Write(kind string, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxChunk)
		s.mu.Lock()
		for s.credit < int64(n) && !s.closed {
			s.cond.Wait()
		}
		if s.closed {
			err := s.err
			s.mu.Unlock()
			return err
		}
		s.credit -= int64(n)
		s.mu.Unlock()
		if err := s.control(kind, p[:n], true); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// Send sends a control message (resize, signal, exit, error, stdin-close) with v as JSON.
func (s *Session) Send(kind string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.control(kind, b, true)
}

func (s *Session) control(kind string, data []byte, sequenced bool) error {
	m := nats.NewMsg(s.send)
	m.Header.Set(hdrKind, kind)
	m.Data = data
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed && kind != kindClose {
		return s.err
	}
	if sequenced {
		s.seq++
		m.Header.Set(hdrSeq, strconv.FormatUint(s.seq, 10))
	}
	// Publishing under the lock keeps sequence order equal to wire order.
	if err := s.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("stream: send: %w", err)
	}
	return nil
}

func (s *Session) fail(err error) {
	s.mu.Lock()
	if !s.closed {
		s.closed, s.err = true, err
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	s.once.Do(func() { close(s.done) })
}

// Close tells the peer the session is over and releases the subscription.
func (s *Session) Close() error {
	s.control(kindClose, nil, true)
	s.nc.Flush()
	s.fail(ErrClosed)
	return s.sub.Unsubscribe()
}

// Done is closed when the session ends for any reason.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is why the session ended.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}
