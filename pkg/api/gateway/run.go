package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/stream"
)

// IO is where a Run's streams come from and go to. Stdin is forwarded only when the request
// asks for it; Resize, when set, carries terminal size changes.
type IO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Resize         <-chan vmmapi.Resize
}

// Run executes req in its sandbox over a fresh stream session and returns how the command
// ended. The error is about reaching the sandbox; the command's failure is in Exit.
func (c *Client) Run(ctx context.Context, req ExecRequest, pipes IO) (vmmapi.Exit, error) {
	return RunSession(ctx, c.nc, req, c.Exec, pipes)
}

// RunSession opens a stream session on nc, asks exec to start req on it, binds the session to
// the host exec names and pumps pipes until the command exits: Run over the gateway's API, or
// the gateway itself over the vmm's.
func RunSession(ctx context.Context, nc *nats.Conn, req ExecRequest, exec func(context.Context, ExecRequest) (Started, error), pipes IO) (vmmapi.Exit, error) {
	req.SID = stream.NewID()
	sess, err := stream.Client(nc, req.SID)
	if err != nil {
		return vmmapi.Exit{}, err
	}
	defer sess.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	started, err := exec(rctx, req)
	cancel()
	if err != nil {
		return vmmapi.Exit{}, err
	}
	if err := sess.Bind(started.Host); err != nil {
		return vmmapi.Exit{}, fmt.Errorf("exec: %w", err)
	}
	if pipes.Resize != nil {
		go func() {
			for {
				select {
				case rs, ok := <-pipes.Resize:
					if !ok {
						return
					}
					sess.Send(stream.KindResize, rs)
				case <-sess.Done():
					return
				}
			}
		}()
	}
	if req.Stdin && pipes.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := pipes.Stdin.Read(buf)
				if n > 0 && sess.Write(stream.KindStdin, buf[:n]) != nil {
					return
				}
				if err != nil {
					sess.Send(stream.KindStdinClose, nil)
					return
				}
			}
		}()
	}
	stop := context.AfterFunc(ctx, func() { sess.Send(stream.KindSignal, 9) })
	defer stop()
	for {
		m, err := sess.Recv()
		if err != nil {
			if errors.Is(err, stream.ErrPeerGone) {
				return vmmapi.Exit{}, fmt.Errorf("exec: lost the sandbox's output stream (is the vmm running?)")
			}
			return vmmapi.Exit{}, fmt.Errorf("exec: the stream ended before the command exited: %w", err)
		}
		switch m.Kind {
		case stream.KindStdout:
			if pipes.Stdout != nil {
				pipes.Stdout.Write(m.Data)
			}
		case stream.KindStderr:
			if pipes.Stderr != nil {
				pipes.Stderr.Write(m.Data)
			}
		case stream.KindExit:
			var exit vmmapi.Exit
			json.Unmarshal(m.Data, &exit)
			return exit, nil
		}
	}
}
