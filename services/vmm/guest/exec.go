package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// killTimeout bounds a kill of a guest process the caller no longer waits for.
const killTimeout = 5 * time.Second

// ExecRequest is what to run; see agentproto.ExecRequest.
type ExecRequest = agentproto.ExecRequest

// Winsize is a terminal size for resize.
type Winsize struct{ Rows, Cols uint16 }

// ExitStatus is how a guest process ended. Code is the exit code, 128+Signal after a signal death,
// 127 when the command was not found and 126 when it could not be started; Error then holds the
// agent's one-line reason (e.g. `exec: "foo": executable file not found in $PATH`).
type ExitStatus struct {
	Code   int    `json:"code"`
	Signal int    `json:"signal,omitempty"`
	Error  string `json:"error,omitempty"`
}

// EventType says what an ExecSession event carries.
type EventType int

const (
	EventStdout EventType = iota + 1
	EventStderr
	EventExit
)

// Event is one output of a running exec. Data is only valid until the next call to Next.
type Event struct {
	Type EventType
	Data []byte
	Exit ExitStatus // for EventExit
}

// ExecSession is a running guest process: the streaming form of Exec, for relays that forward
// frames elsewhere (the bus). Input methods may be called concurrently with Next.
type ExecSession struct {
	c       *Client
	st      *yamux.Stream
	fw      *agentproto.FrameWriter
	br      *bufio.Reader
	buf     []byte
	release func()
	errMsg  string
	done    atomic.Bool // the exit was read: Next sets it while Close, on another goroutine, reads it
}

// StartExec starts req in the guest. ctx bounds the whole session: when it ends, reads and
// writes fail (the caller should Signal(SIGKILL) first if the process must die).
func (c *Client) StartExec(ctx context.Context, req ExecRequest) (*ExecSession, error) {
	st, _, release, err := c.open(ctx, agentproto.Request{Op: agentproto.OpExec, Exec: &req})
	if err != nil {
		return nil, err
	}
	return &ExecSession{
		c:       c,
		st:      st,
		fw:      agentproto.NewFrameWriter(st),
		br:      bufio.NewReaderSize(st, 64<<10),
		buf:     make([]byte, agentproto.MaxFramePayload),
		release: release,
	}, nil
}

// WriteStdin sends p to the process stdin (in frames of at most MaxFramePayload bytes).
func (e *ExecSession) WriteStdin(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), agentproto.MaxFramePayload)
		if err := e.fw.WriteFrame(agentproto.FrameStdin, p[:n]); err != nil {
			return fmt.Errorf("exec: stdin: %w", err)
		}
		p = p[n:]
	}
	return nil
}

// CloseStdin closes the process stdin (on a pty: sends end-of-file, ^D).
func (e *ExecSession) CloseStdin() error {
	return e.fw.WriteFrame(agentproto.FrameStdinClose, nil)
}

// Resize changes the pty size (ignored without a tty).
func (e *ExecSession) Resize(rows, cols uint16) error {
	return e.fw.WriteFrame(agentproto.FrameResize, agentproto.EncodeResize(rows, cols))
}

// Signal sends sig to the process group.
func (e *ExecSession) Signal(sig syscall.Signal) error {
	return e.fw.WriteFrame(agentproto.FrameSignal, agentproto.EncodeSignal(uint32(sig)))
}

// Kill kills the process group. It is asked for on a stream of its own, so it reaches the
// agent while this session's input is held back (a process that reads none of its stdin fills
// every window, and a signal frame would wait behind that stdin); an agent older than exec-kill
// is sent the signal in-band instead. ctx bounds the whole of it.
func (e *ExecSession) Kill(ctx context.Context) error {
	_, err := e.c.call(ctx, agentproto.Request{Op: agentproto.OpExecKill, Stream: e.st.StreamID()})
	if err == nil || !errors.Is(err, errdefs.ErrInvalid) {
		return err
	}
	stop := context.AfterFunc(ctx, func() { e.st.SetWriteDeadline(longAgo) })
	defer stop()
	return e.Signal(syscall.SIGKILL)
}

// Next returns the next output event; after EventExit it returns io.EOF.
func (e *ExecSession) Next() (Event, error) {
	if e.done.Load() {
		return Event{}, io.EOF
	}
	for {
		t, p, err := agentproto.ReadFrame(e.br, e.buf)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Event{}, fmt.Errorf("exec: %w", err)
		}
		switch t {
		case agentproto.FrameStdout:
			return Event{Type: EventStdout, Data: p}, nil
		case agentproto.FrameStderr:
			return Event{Type: EventStderr, Data: p}, nil
		case agentproto.FrameError:
			if len(e.errMsg) < 4096 {
				e.errMsg += string(p)
			}
		case agentproto.FrameExit:
			code, sig := agentproto.DecodeExit(p)
			e.done.Store(true)
			return Event{Type: EventExit, Exit: ExitStatus{Code: int(code), Signal: int(sig), Error: e.errMsg}}, nil
		default:
			return Event{}, fmt.Errorf("exec: unexpected %s frame from the agent", t)
		}
	}
}

// Close ends the session (the agent kills a process whose session broke before it exited).
func (e *ExecSession) Close() error {
	e.release()
	e.st.Close()
	if !e.done.Load() {
		e.st.SetDeadline(longAgo)
	}
	return nil
}

// Exec runs req to completion: stdin (when non-nil) is copied to the process, stdout and stderr
// stream as produced, resize (when non-nil) follows the terminal. The error is only about the
// channel or ctx; how the process ended is in ExitStatus. When ctx ends the process is killed.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer, resize <-chan Winsize) (ExitStatus, error) {
	if stdin != nil {
		req.Stdin = true
	}
	s, err := c.StartExec(ctx, req)
	if err != nil {
		return ExitStatus{}, err
	}
	defer s.Close()
	done := make(chan struct{})
	defer close(done)
	if stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := stdin.Read(buf)
				if n > 0 {
					if s.WriteStdin(buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					s.CloseStdin()
					return
				}
			}
		}()
	}
	if resize != nil {
		go func() {
			for {
				select {
				case ws, ok := <-resize:
					if !ok {
						return
					}
					s.Resize(ws.Rows, ws.Cols)
				case <-done:
					return
				}
			}
		}()
	}
	kill := context.AfterFunc(ctx, func() {
		kctx, cancel := context.WithTimeout(context.Background(), killTimeout)
		defer cancel()
		s.Kill(kctx)
	})
	defer kill()
	for {
		ev, err := s.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ExitStatus{}, fmt.Errorf("exec: %w", ctx.Err())
			}
			return ExitStatus{}, err
		}
		var w io.Writer
		switch ev.Type {
		case EventStdout:
			w = stdout
		case EventStderr:
			w = stderr
		case EventExit:
			if ctx.Err() != nil && ev.Exit.Signal == int(syscall.SIGKILL) {
				// Killed because the caller's deadline passed: that is the answer, not the 137.
				return ev.Exit, fmt.Errorf("exec: %w", ctx.Err())
			}
			return ev.Exit, nil
		}
		if w != nil {
			if _, err := w.Write(ev.Data); err != nil {
				s.Signal(syscall.SIGKILL)
				return ExitStatus{}, fmt.Errorf("exec: write output: %w", err)
			}
		}
	}
}

var errShortCopy = errors.New("source ended before the announced size")
