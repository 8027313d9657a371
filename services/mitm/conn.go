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

// idleConn is a guest connection. Once hijacked for a tunnel, every read first pushes the read
// deadline IdleTimeout into the future, unless a deadline set explicitly (a handshake or request
// header timeout) comes sooner.
type idleConn struct {
	net.Conn
	idle     time.Duration
	p        *Proxy
	armed    atomic.Bool
	closed   sync.Once
	deadline atomic.Int64 // explicit read deadline, unix nanoseconds; 0: none
}

func (c *idleConn) Read(b []byte) (int, error) {
	if c.armed.Load() {
		d := time.Now().Add(c.idle)
		if ex := c.deadline.Load(); ex != 0 && ex < d.UnixNano() {
			d = time.Unix(0, ex)
		}
		c.Conn.SetReadDeadline(d)
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

func (c *idleConn) storeDeadline(t time.Time) {
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
