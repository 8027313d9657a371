package portfwd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// forward is one guest port of one sandbox and, while forwarding, its host listener.
type forward struct {
	id, name string
	port     uint16
	addr     string // guest address
	state    string
	holder   string
	since    time.Time

	ln       net.Listener
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	accepted uint64 // connections taken since start (under mu)
}

// start serves ln: each accepted connection is relayed to the guest port through the
// sandbox's hybrid-vsock socket under dir.
func (f *forward) start(s *Service, ln net.Listener, dir string) {
	f.ln = ln
	f.conns = map[net.Conn]struct{}{}
	sock := filepath.Join(dir, "vsock.sock")
	port, max, timeout, log := int(f.port), s.cfg.MaxConns, s.cfg.ConnectTimeout, s.log
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				return
			}
			if !f.track(c, max) {
				c.Close()
				continue
			}
			go func() {
				defer f.untrack(c)
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				g, err := DialGuest(ctx, sock, port)
				cancel()
				if err != nil {
					log.Debug().Err(err).Str("sandbox", f.name).Int("port", port).Msg("relay: guest did not accept")
					c.Close()
					return
				}
				if tc, ok := c.(*net.TCPConn); ok {
					tc.SetNoDelay(true)
				}
				agentproto.Splice(c, g)
			}()
		}
	}()
}

func (f *forward) track(c net.Conn, max int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil || len(f.conns) >= max {
		return false
	}
	f.conns[c] = struct{}{}
	f.accepted++
	return true
}

// activity is the connections relayed now and all those taken so far.
func (f *forward) activity() (open int, accepted uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns), f.accepted
}

func (f *forward) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

// stop closes the host listener, so the port is free when it returns; closeConns also ends
// the relayed connections.
func (f *forward) stop(closeConns bool) {
	if f.ln != nil {
		f.ln.Close()
		f.ln = nil
	}
	if !closeConns {
		return
	}
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// maxOKLine bounds the hybrid-vsock reply line.
const maxOKLine = 32

// DialGuest opens a connection to guest TCP port through a hybrid-vsock socket (Cloud
// Hypervisor semantics): it writes "CONNECT <port>\n" and expects "OK <port>\n" before ctx
// ends. The returned conn carries the guest's bytes and supports CloseWrite.
func DialGuest(ctx context.Context, sock string, port int) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("dial guest port %d: %w", port, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		c.Close()
		return nil, fmt.Errorf("dial guest port %d: %w", port, err)
	}
	if err := ReadOK(c, port); err != nil {
		c.Close()
		return nil, fmt.Errorf("dial guest port %d: %w", port, err)
	}
	if !stop() {
		c.Close()
		return nil, fmt.Errorf("dial guest port %d: %w", port, ctx.Err())
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// ReadOK reads the hybrid-vsock reply "OK <port>\n" one byte at a time (so none of the guest's
// bytes after it are consumed), at most 32 bytes, and checks the port.
func ReadOK(r io.Reader, port int) error {
	var buf [maxOKLine]byte
	n := 0
	for {
		if n == len(buf) {
			return errors.New("reply line too long")
		}
		if _, err := io.ReadFull(r, buf[n:n+1]); err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("closed without a reply (nothing listens on that guest port?)")
			}
			return err
		}
		if buf[n] == '\n' {
			break
		}
		n++
	}
	if want := "OK " + strconv.Itoa(port); string(buf[:n]) != want {
		return fmt.Errorf("unexpected reply %q", buf[:n])
	}
	return nil
}
