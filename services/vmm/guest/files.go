package guest

import (
	"bufio"
	"context"
	"fmt"
	"io"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// CopyIn writes req.Size bytes read from r to req.Path in the guest, atomically: the file appears
// whole or not at all.
func (c *Client) CopyIn(ctx context.Context, req agentproto.CopyInRequest, r io.Reader) error {
	if req.Size < 0 {
		return fmt.Errorf("copy-in: negative size")
	}
	st, _, release, err := c.open(ctx, agentproto.Request{Op: agentproto.OpCopyIn, CopyIn: &req})
	if err != nil {
		return err
	}
	defer release()
	defer st.Close()
	fw := agentproto.NewFrameWriter(st)
	buf := make([]byte, agentproto.FrameHeaderLen+agentproto.MaxFramePayload)
	left := req.Size
	for left > 0 {
		n, rerr := r.Read(buf[agentproto.FrameHeaderLen : agentproto.FrameHeaderLen+int(min(left, agentproto.MaxFramePayload))])
		if n > 0 {
			if err := fw.WriteHeaded(agentproto.FrameData, buf[:agentproto.FrameHeaderLen+n]); err != nil {
				return ctxErr(ctx, fmt.Errorf("copy-in: %w", err))
			}
			left -= int64(n)
		}
		if rerr == io.EOF && left > 0 {
			// End the stream so the agent discards its temporary file, then report.
			fw.WriteFrame(agentproto.FrameEnd, nil)
			agentproto.ReadResponse(st)
			return fmt.Errorf("copy-in: %s: %w", req.Path, errShortCopy)
		}
		if rerr != nil && rerr != io.EOF {
			fw.WriteFrame(agentproto.FrameEnd, nil)
			return fmt.Errorf("copy-in: read source: %w", rerr)
		}
	}
	if err := fw.WriteFrame(agentproto.FrameEnd, nil); err != nil {
		return ctxErr(ctx, fmt.Errorf("copy-in: %w", err))
	}
	if _, err := agentproto.ReadResponse(st); err != nil {
		return ctxErr(ctx, err)
	}
	return nil
}

// CopyOut copies the guest regular file at path to w and returns its size and mode.
func (c *Client) CopyOut(ctx context.Context, path string, w io.Writer) (*agentproto.FileInfo, error) {
	st, resp, release, err := c.open(ctx, agentproto.Request{Op: agentproto.OpCopyOut, CopyOut: &agentproto.CopyOutRequest{Path: path}})
	if err != nil {
		return nil, err
	}
	defer release()
	defer st.Close()
	if resp.File == nil {
		return nil, fmt.Errorf("copy-out: %s: answer without file info", path)
	}
	err = readData(bufio.NewReaderSize(st, 64<<10), func(p []byte) error {
		_, err := w.Write(p)
		return err
	})
	if err != nil {
		return nil, ctxErr(ctx, fmt.Errorf("copy-out: %s: %w", path, err))
	}
	return resp.File, nil
}
