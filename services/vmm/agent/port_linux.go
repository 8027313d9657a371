package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// FindPort returns the /dev node of the virtio-serial port named name, waiting up to timeout for
// it to appear (device probing and devtmpfs node creation are asynchronous).
func FindPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil || strings.TrimSpace(string(b)) != name {
				continue
			}
			dev := "/dev/" + filepath.Base(filepath.Dir(n))
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio port %q: not found under /sys/class/virtio-ports", name)
		}
		time.Sleep(20 * time.Millisecond) // no event to wait on before udev exists
	}
}

// ServePort serves the protocol on a virtio-serial port device, opened once (the port allows one
// open) for the agent's whole life. Each host connection is one handshake plus one yamux session;
// between sessions the host may be absent, in which case reads return 0 bytes at once, so the
// agent polls for the next Hello.
func (s *Server) ServePort(ctx context.Context, path string) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return fmt.Errorf("port %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path) // non-blocking: pollable, so deadlines can end a session
	defer f.Close()
	pr := &portReader{f: f, ctx: ctx}
	br := bufio.NewReaderSize(pr, 64<<10)
	nonce := ""
	for ctx.Err() == nil {
		f.SetDeadline(time.Time{})
		if nonce == "" {
			pr.waiting.Store(true)
			var err error
			if nonce, err = agentproto.AwaitHello(br); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				s.log.Warn().Err(err).Msg("port handshake")
				continue
			}
			pr.waiting.Store(false)
		}
		if _, err := f.Write(agentproto.Ready(nonce)); err != nil {
			s.log.Warn().Err(err).Msg("port handshake")
			nonce = ""
			continue
		}
		pc := &portConn{r: br, f: f}
		err := s.serveSession(ctx, pc)
		nonce = ""
		if err != nil {
			s.log.Warn().Err(err).Msg("port session")
			// A guest restored from a snapshot (a fork) still runs the session of the host it was
			// saved from; the new host's Hello lands in that stale session and breaks it. The
			// Hello was consumed by the session, so answer it from what the session last read.
			if errors.Is(err, yamux.ErrInvalidVersion) {
				nonce = pc.staleHello()
			}
		}
	}
	return nil
}

// portReader reads the port; while waiting for a host it turns "no host" EOFs into a short wait.
type portReader struct {
	f       *os.File
	ctx     context.Context
	waiting atomic.Bool
}

func (p *portReader) Read(b []byte) (int, error) {
	for {
		n, err := p.f.Read(b)
		if n > 0 || !errors.Is(err, io.EOF) || !p.waiting.Load() {
			return n, err
		}
		select {
		case <-p.ctx.Done():
			return 0, p.ctx.Err()
		case <-time.After(20 * time.Millisecond): // the host is not connected yet
		}
	}
}

// portConn is one session's view of the port: Close ends the session's pending reads without
// closing the device, which stays open for the next host. It keeps the last bytes the session
// read, where a new host's Hello is found after it broke a stale session.
type portConn struct {
	r    *bufio.Reader
	f    *os.File
	tail []byte // the last tailSize bytes read
}

// tailSize holds a whole Hello line (prefix, up to 64 hex digits, newline).
const tailSize = 128

func (c *portConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	if n > 0 {
		c.tail = append(c.tail, b[max(0, n-tailSize):n]...)
		if len(c.tail) > tailSize {
			c.tail = append(c.tail[:0], c.tail[len(c.tail)-tailSize:]...)
		}
	}
	return n, err
}

// staleHello returns the nonce of a complete Hello line among the last bytes read, or "".
func (c *portConn) staleHello() string {
	nonce := ""
	r := bufio.NewReader(bytes.NewReader(c.tail))
	for {
		n, err := agentproto.AwaitHello(r)
		if err != nil {
			return nonce
		}
		nonce = n
	}
}
func (c *portConn) Write(b []byte) (int, error) { return c.f.Write(b) }
func (c *portConn) Close() error                { return c.f.SetDeadline(time.Now()) }
