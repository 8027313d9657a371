package guest_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/services/vmm/agent"
	"github.com/IniZio/nexus/services/vmm/guest"
)

// TestDialSlowGuest: once QEMU has said the guest opened its port, a guest that takes longer
// than the short pre-open attempt to answer (TCG on a loaded host) still gets its answer in.
// Before, every attempt was cut at 500 ms and redone, so such a guest was never reached and
// the create failed with "the guest agent did not answer".
func TestDialSlowGuest(t *testing.T) {
	sock := filepath.Join(shortTemp(t), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	srv, _ := agent.New(agent.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const slow = 1500 * time.Millisecond
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go srv.ServeConn(ctx, &slowConn{Conn: c, delay: slow})
		}
	}()
	opened := make(chan struct{}, 1)
	opened <- struct{}{} // the port is already open when Dial starts
	start := time.Now()
	c, err := guest.DialConfig(ctx, sock, guest.Config{PortOpened: opened})
	if err != nil {
		t.Fatalf("a guest answering in %v was never reached: %v", slow, err)
	}
	defer c.Close()
	if c.Agent().Version != agentproto.Version {
		t.Fatalf("pong %+v", c.Agent())
	}
	t.Logf("reached after %v", time.Since(start).Round(time.Millisecond))
}

// slowConn holds the guest's first answer back by delay, on every connection.
type slowConn struct {
	net.Conn
	delay   time.Duration
	written bool
}

func (c *slowConn) Write(p []byte) (int, error) {
	if !c.written {
		c.written = true
		time.Sleep(c.delay)
	}
	return c.Conn.Write(p)
}

// TestDialRestoredGuestKeepsItsFirstHandshake: a guest restored from a template or snapshot has
// its port open already, and its first answer is slow (its code caches are cold). Dial told so
// (PortOpen) waits for that answer on its first connection. Before, the first attempt was cut
// at 250 ms and each retry broke the session the guest had just started: a warm create paid
// 250 ms for nothing on a quiet host, and seconds of retries on a loaded one.
func TestDialRestoredGuestKeepsItsFirstHandshake(t *testing.T) {
	for _, open := range []bool{true, false} {
		sock := filepath.Join(shortTemp(t), "agent.sock")
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		srv, _ := agent.New(agent.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		conns := make(chan struct{}, 100)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				conns <- struct{}{}
				go srv.ServeConn(ctx, &slowConn{Conn: c, delay: 400 * time.Millisecond})
			}
		}()
		c, err := guest.DialConfig(ctx, sock, guest.Config{PortOpen: open})
		if err != nil {
			t.Fatalf("PortOpen %v: %v", open, err)
		}
		c.Close()
		switch n := len(conns); {
		case open && n != 1:
			t.Errorf("a restored guest's first handshake was abandoned: %d connections, want 1", n)
		case !open && n < 2:
			t.Errorf("without PortOpen the first attempt waited %d connection(s) out; the test no longer tells the two apart", n)
		}
	}
}
