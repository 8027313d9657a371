package mitm

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// trackedListener wraps accepted connections so Close can end hijacked tunnels (net/http forgets
// a connection once goproxy hijacks it) and so idle tunnels time out.
type trackedListener struct {
	net.Listener
	p *Proxy
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ic := &idleConn{Conn: c, idle: l.p.cfg.IdleTimeout, p: l.p}
	l.p.mu.Lock()
	if l.p.closed {
		l.p.mu.Unlock()
		c.Close()
		return nil, net.ErrClosed
	}
	l.p.conns[ic] = struct{}{}
	l.p.mu.Unlock()
	return ic, nil
}

// idleConn is a guest connection. Once hijacked for a tunnel, a read first pushes the read
// deadline IdleTimeout into the future, unless a deadline set explicitly (a handshake or request
// header timeout) comes sooner. Without an explicit deadline the push is skipped while the last
// one is recent (within IdleTimeout/idleSlack): a tunnel is closed after between
// IdleTimeout×(1-1/idleSlack) and IdleTimeout of silence, for one timer update per many requests.
type idleConn struct {
	net.Conn
	idle     time.Duration
	p        *Proxy
	armed    atomic.Bool
	closed   sync.Once
	deadline atomic.Int64 // explicit read deadline, unix nanoseconds; 0: none
	pushed   atomic.Int64 // when the idle deadline was last pushed, unix nanoseconds; 0: not in force
}

const idleSlack = 16

func (c *idleConn) Read(b []byte) (int, error) {
	if c.armed.Load() {
		now := time.Now()
		ex := c.deadline.Load()
		if ex != 0 || now.UnixNano()-c.pushed.Load() > int64(c.idle/idleSlack) {
			d := now.Add(c.idle)
			if ex != 0 && ex < d.UnixNano() {
				d = time.Unix(0, ex)
			}
			c.Conn.SetReadDeadline(d)
			if ex == 0 {
				c.pushed.Store(now.UnixNano())
			}
		}
	}
	return c.Conn.Read(b)
}

func (c *idleConn) SetReadDeadline(t time.Time) error {
	c.storeDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *idleConn) SetDeadline(t time.Time) error {
	c.storeDeadline(t)
	return c.Conn.SetDeadline(t)
}

// storeDeadline records an explicit deadline; the idle deadline is no longer in force.
func (c *idleConn) storeDeadline(t time.Time) {
	c.pushed.Store(0)
	if t.IsZero() {
		c.deadline.Store(0)
		return
	}
	c.deadline.Store(t.UnixNano())
}

func (c *idleConn) Close() error {
	c.closed.Do(func() {
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
	return c.Conn.Close()
}

// hijackNotifier arms the idle timeout of the connection goproxy hijacks.
type hijackNotifier struct{ http.ResponseWriter }

func (h hijackNotifier) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := h.ResponseWriter.(http.Hijacker).Hijack()
	if err == nil {
		if ic, ok := c.(*idleConn); ok {
			ic.armed.Store(true)
		}
	}
	return c, rw, err
}
