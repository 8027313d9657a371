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
