// Package stream carries a long-lived, two-way byte session over the bus: exec output and
// input, attach, log following. Each direction has its own subject on the service's host
// (nexus.stream.<host>.<sid>.out from the service, nexus.stream.<host>.<sid>.in from the
// client), so that a host's services can serve and reach only their own host's sessions; every
// message a sequence number, and data flows only against credit the receiver granted, so a slow
// reader slows the guest process instead of filling memory. Heartbeats tell each side when the
// other is gone (a killed CLI ends its guest process). Liveness never waits on the consumer: a
// reader that stalls for minutes holds at most Window bytes here while pings keep flowing.
package stream

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

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

// Timing of liveness, read when a session opens; SetPeerGone changes both (the
// --stream-peer-gone setting, which tests shorten).
var (
	PingEvery = time.Second
	PeerGone  = 10 * time.Second
)

// SetPeerGone sets how long a silent peer is waited for, pinging four times as often (at
// most once a second).
func SetPeerGone(d time.Duration) {
	PeerGone, PingEvery = d, min(time.Second, d/4)
}

// maxQueued bounds the messages received and not yet read: data is bounded by the window, and
// this bounds the control messages a misbehaving peer could pile up.
const maxQueued = 4096

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
	nc  *nats.Conn
	sid string
	// send is the subject this side sends on; a client learns it (the service's host) from the
	// first message the service sends, and its sends wait until then.
	send    string
	recv    string
	sub     *nats.Subscription
	in      chan *nats.Msg
	mu      sync.Mutex
	cond    *sync.Cond
	seq     uint64 // last sent
	credit  int64  // bytes we may still send
	closed  bool
	err     error
	done    chan struct{}
	once    sync.Once
	pending int64 // bytes consumed but not yet returned as credit
	// queue holds messages received in order and not yet read by Recv; buffered counts its
	// data bytes, which credit keeps within Window. The receive loop never waits for Recv;
	// once the session is closed Recv returns what is queued, then err.
	queue    []Msg
	buffered int64
	ping     time.Duration
	gone     time.Duration
}

// NewID returns a fresh session id: 130 random bits from crypto/rand (26 letters and digits),
// so that nobody who sees some of a process's session ids can guess its next ones.
func NewID() string { return rand.Text() }

// maxID bounds a session id: one subject token of letters and digits (NewID's are 26).
const maxID = 64

// ValidID checks that sid is a session id: one subject token of at most 64 letters and
// digits, so that no session can name a wildcard or another host's subjects.
func ValidID(sid string) error {
	if sid == "" || len(sid) > maxID {
		return fmt.Errorf("stream: a session id has 1 to %d letters and digits, not %d", maxID, len(sid))
	}
	for _, c := range sid {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return fmt.Errorf("stream: a session id has only letters and digits")
		}
	}
	return nil
}

// OutSubject and InSubject name the two directions of session sid served on host.
func OutSubject(host, sid string) string { return bus.StreamPrefix + "." + host + "." + sid + ".out" }
func InSubject(host, sid string) string  { return bus.StreamPrefix + "." + host + "." + sid + ".in" }

// AnyHostOut is what a client follows of session sid before it knows the service's host:
// its .out on every host.
func AnyHostOut(sid string) string { return bus.StreamPrefix + ".*." + sid + ".out" }

// Follow calls fn with each message published on session sid's .out, one at a time: a
// progress session's (a create's boot steps, an image operation's progress). With host named
// it hears that host's .out only; without, the first host heard, and drops any other's.
func Follow(nc *nats.Conn, host, sid string, fn func(data []byte)) (*nats.Subscription, error) {
	if err := ValidID(sid); err != nil {
		return nil, err
	}
	subject := AnyHostOut(sid)
	if host != "" {
		if err := validHost(host); err != nil {
			return nil, err
		}
		subject = OutSubject(host, sid)
	}
	var mu sync.Mutex
	heard := host
	return nc.Subscribe(subject, func(m *nats.Msg) {
		from := hostOf(m.Subject, sid)
		mu.Lock()
		if heard == "" {
			heard = from
		}
		ok := from != "" && from == heard
		mu.Unlock()
		if ok {
			fn(m.Data)
		}
	})
}

// validHost checks that host is one subject token, as a host name in a session's subjects must be.
func validHost(host string) error {
	if strings.ContainsAny(host, ".*> \t\r\n") {
		return fmt.Errorf("stream: %q is not a host name", host)
	}
	return nil
}

// hostOf is the host token of subject, a session sid's .out on some host ("" if it is not).
func hostOf(subject, sid string) string {
	rest, ok := strings.CutPrefix(subject, bus.StreamPrefix+".")
	if !ok {
		return ""
	}
	host, ok := strings.CutSuffix(rest, "."+sid+".out")
	if !ok || host == "" || strings.ContainsAny(host, ".*>") {
		return ""
	}
	return host
}

// Client opens the client side of sid: it receives on sid's .out on whichever host serves it
// and sends on that host's .in. Open it before asking the service to start, so nothing the
// service sends is missed; what it sends waits until the service has spoken (Server does at
// once). When the reply that started the session names the host, Bind to it: until then the
// first host to speak is taken for the session's.
func Client(nc *nats.Conn, sid string) (*Session, error) {
	if err := ValidID(sid); err != nil {
		return nil, err
	}
	return open(nc, sid, "", AnyHostOut(sid))
}

// Server opens the service side of sid on host, the service's own: it receives on .in and
// sends on .out, and says so at once so that the client learns where it is.
func Server(nc *nats.Conn, host, sid string) (*Session, error) {
	if err := ValidID(sid); err != nil {
		return nil, err
	}
	s, err := open(nc, sid, OutSubject(host, sid), InSubject(host, sid))
	if err != nil {
		return nil, err
	}
	s.control(kindPing, nil, false)
	return s, nil
}

func open(nc *nats.Conn, sid, send, recv string) (*Session, error) {
	s := &Session{nc: nc, sid: sid, send: send, recv: recv, in: make(chan *nats.Msg, 1024), credit: Window, done: make(chan struct{}),
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
// and queues messages for Recv. It never blocks on the consumer, so pings flow both ways however
// slowly the messages are read.
func (s *Session) loop() {
	tick := time.NewTicker(s.ping)
	defer tick.Stop()
	var expect uint64 = 1
	last := time.Now()
	for {
		select {
		case m := <-s.in:
			if !s.from(m.Subject) {
				continue
			}
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
			if err := s.enqueue(Msg{Kind: kind, Data: m.Data}); err != nil {
				s.fail(err)
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

// from reports whether a message on subject is the peer's. A client not bound to a host
// (Bind) takes the first service to speak as its peer, learning its host; any other host's
// messages are dropped.
func (s *Session) from(subject string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if subject == s.recv {
		return true
	}
	host := hostOf(subject, s.sid)
	if host == "" {
		return false
	}
	if s.send == "" {
		s.send, s.recv = InSubject(host, s.sid), subject
		s.cond.Broadcast()
		return true
	}
	return false
}

// Bind makes a client hear and speak to host only, the host that serves the session (the
// gateway names it when the session starts): messages on any other host's .out are dropped.
// If another host has spoken first, the session fails with an error naming both, and what
// that host sent is dropped unread. Bind before sending anything that must reach only the
// session's host. An empty host (an older gateway's reply) keeps the first speaker.
func (s *Session) Bind(host string) error {
	if host == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := validHost(host)
	if peer := hostOf(s.recv, s.sid); err == nil && peer != "" && peer != host {
		err = fmt.Errorf("stream: session %s is served by host %s, but host %s spoke on it first", s.sid, host, peer)
	}
	if err != nil { // nothing the wrong host sent is read
		s.queue, s.buffered = nil, 0
		s.closed, s.err = true, err
		s.cond.Broadcast()
		s.once.Do(func() { close(s.done) })
		return err
	}
	// A session its host has already ended keeps what it sent for Recv.
	if !s.closed {
		s.send, s.recv = InSubject(host, s.sid), OutSubject(host, s.sid)
		s.cond.Broadcast()
	}
	return nil
}

// enqueue hands m to Recv; a peer sending beyond the credit it was granted is refused.
func (s *Session) enqueue(m Msg) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil // ended meanwhile (a failed Bind dropped the queue): the loop stops next
	}
	if isData(m.Kind) {
		if s.buffered+int64(len(m.Data)) > Window {
			return fmt.Errorf("stream: the other side sent more than the %d bytes of credit it was granted", Window)
		}
		s.buffered += int64(len(m.Data))
	}
	if len(s.queue) >= maxQueued {
		return fmt.Errorf("stream: the other side sent more than %d messages that were not read", maxQueued)
	}
	s.queue = append(s.queue, m)
	s.cond.Broadcast()
	return nil
}

// Recv returns the next message; data messages return their size as credit to the sender.
// Messages received before the session ended are still returned, then the reason it ended.
func (s *Session) Recv() (Msg, error) {
	s.mu.Lock()
	for len(s.queue) == 0 && !s.closed {
		s.cond.Wait()
	}
	if len(s.queue) == 0 {
		defer s.mu.Unlock()
		return Msg{}, s.err
	}
	m := s.queue[0]
	s.queue[0] = Msg{}
	s.queue = s.queue[1:]
	var grant int64
	if isData(m.Kind) {
		s.buffered -= int64(len(m.Data))
		s.pending += int64(len(m.Data))
		if s.pending >= Window/4 {
			grant, s.pending = s.pending, 0
		}
	}
	s.mu.Unlock()
	if grant > 0 {
		s.control(kindCredit, []byte(strconv.FormatInt(grant, 10)), false)
	}
	return m, nil
}

// Buffered is how many data bytes were received and not yet read: never more than Window.
func (s *Session) Buffered() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buffered
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed && kind != kindClose {
		return s.err
	}
	if s.send == "" {
		// A client whose service has not spoken yet: pings and a close have nobody to go to;
		// anything else waits for the service (or the session's end).
		if !sequenced || kind == kindClose {
			return nil
		}
		for s.send == "" && !s.closed {
			s.cond.Wait()
		}
		if s.closed {
			return s.err
		}
	}
	m := nats.NewMsg(s.send)
	m.Header.Set(hdrKind, kind)
	m.Data = data
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
