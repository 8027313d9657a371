package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/stream"
)

// CopyOut streams the guest file path of sandbox name into w (one file, as `nexus cp NAME:/path
// dst` copies).
func (c *Client) CopyOut(ctx context.Context, name, path string, w io.Writer) error {
	return c.copyStream(ctx, CopyRequest{Name: name, Path: path}, nil, w)
}

// CopyIn writes size bytes of r to the guest file path of sandbox name with mode.
func (c *Client) CopyIn(ctx context.Context, name, path string, mode uint32, size int64, r io.Reader) error {
	return c.copyStream(ctx, CopyRequest{Name: name, Path: path, ToGuest: true, Mode: mode, Size: size}, r, nil)
}

// copyStream opens a stream session, asks for req on it, sends in (to the guest) or receives
// into out (from it), and returns how the copy ended.
func (c *Client) copyStream(ctx context.Context, req CopyRequest, in io.Reader, out io.Writer) error {
	req.SID = stream.NewID()
	sess, err := stream.Client(c.nc, req.SID)
	if err != nil {
		return err
	}
	defer sess.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	started, err := c.Copy(rctx, req)
	cancel()
	if err != nil {
		return err
	}
	if err := sess.Bind(started.Host); err != nil {
		return fmt.Errorf("copy %s:%s: %w", req.Name, req.Path, err)
	}
	if in != nil {
		go func() {
			buf := make([]byte, stream.MaxChunk)
			for {
				n, err := in.Read(buf)
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
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	for {
		m, err := sess.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("copy %s:%s: %w", req.Name, req.Path, ctx.Err())
			}
			return fmt.Errorf("copy %s:%s: the stream ended early: %w", req.Name, req.Path, err)
		}
		switch m.Kind {
		case stream.KindStdout:
			if out != nil {
				if _, err := out.Write(m.Data); err != nil {
					return fmt.Errorf("copy %s:%s: %w", req.Name, req.Path, err)
				}
			}
		case stream.KindExit:
			var exit vmmapi.Exit
			if err := json.Unmarshal(m.Data, &exit); err != nil {
				return errors.Join(errdefs.ErrInternal, err)
			}
			if exit.Code != 0 {
				return fmt.Errorf("copy %s:%s: %s", req.Name, req.Path, exit.Error)
			}
			return nil
		}
	}
}
