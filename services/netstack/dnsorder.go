package netstack

import (
	"encoding/binary"
	"net"
	"sync"
	"time"
)

// Bounds on what a guest can make the ordering hold: miekg/dns drops some datagrams without
// calling the handler (their turn never ends), and a guest controls sources and IDs.
const (
	// orderWait is the longest an answer waits for the answer to an earlier query with its
	// source and ID.
	orderWait = 2 * time.Second
	// maxTurns is how many unanswered queries are tracked; past it, answers are not ordered.
	maxTurns = 1024
)

// orderedConn is the gateway's DNS socket. miekg/dns answers each datagram in its own goroutine,
// so answers can leave in any order; that is fine for clients that match an answer by ID and
// question, but busybox nslookup matches by ID alone and takes the first answer carrying an ID
// for its first query. Its A and AAAA queries share one ID whenever the guest clock is coarse
// (glibc derives the ID from CLOCK_MONOTONIC, which has jiffy resolution in a TCG guest), so an
// AAAA answer that overtook the A answer was read as "no address" and the A answer dropped as a
// duplicate. orderedConn sends the answers to queries that share a source and an ID in the
// order the queries came; others are not held up.
type orderedConn struct {
	net.PacketConn
	mu   sync.Mutex
	last map[orderKey]*turn // the latest query of each source and ID not yet answered
}

type orderKey struct {
	src string
	id  uint16
}

// turn is one query's place in line: it may be answered once prev is closed.
type turn struct {
	key  orderKey
	prev <-chan struct{}
	done chan struct{}
	once sync.Once
}

// querySource is the source address of a query, carrying its turn to WriteTo through miekg/dns
// (which hands the address it read back to WriteTo).
type querySource struct {
	*net.UDPAddr
	turn *turn
}

func newOrderedConn(pc net.PacketConn) *orderedConn {
	return &orderedConn{PacketConn: pc, last: map[orderKey]*turn{}}
}

// ReadFrom reads one datagram and, for a query (miekg/dns ignores responses and runts), takes
// its turn.
func (c *orderedConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, addr, err := c.PacketConn.ReadFrom(b)
	ua, ok := addr.(*net.UDPAddr)
	if err != nil || !ok || n < 12 || b[2]&0x80 != 0 {
		return n, addr, err
	}
	t := &turn{key: orderKey{src: ua.String(), id: binary.BigEndian.Uint16(b)}, done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.last[t.key]
	if prev == nil && len(c.last) >= maxTurns {
		return n, addr, nil // too many unanswered queries: this one is not ordered
	}
	if prev != nil {
		t.prev = prev.done
	}
	c.last[t.key] = t
	return n, &querySource{UDPAddr: ua, turn: t}, nil
}

// WriteTo sends an answer once every earlier query with its source and ID has been answered.
func (c *orderedConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	src, ok := addr.(*querySource)
	if !ok {
		return c.PacketConn.WriteTo(b, addr)
	}
	if src.turn.prev != nil {
		timer := time.NewTimer(orderWait)
		select {
		case <-src.turn.prev:
		case <-timer.C:
		}
		timer.Stop()
	}
	defer c.answered(src)
	return c.PacketConn.WriteTo(b, src.UDPAddr)
}

// answered ends a query's turn; serveDNS calls it too, so a turn ends even if no answer could be
// sent.
func (c *orderedConn) answered(addr net.Addr) {
	src, ok := addr.(*querySource)
	if !ok {
		return
	}
	t := src.turn
	t.once.Do(func() {
		c.mu.Lock()
		if c.last[t.key] == t {
			delete(c.last, t.key)
		}
		c.mu.Unlock()
		close(t.done)
	})
}
