package httpapi

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/IniZio/nexus/gateway/mcp"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// ExecStreamType is the content type of POST /v1/sandboxes/{name}/exec/stream's answer: frames
// of a channel byte (ChanStdout, ChanStderr, then one ChanExit), a big-endian uint32 length and
// that many bytes. The ChanExit frame, always the last, holds a WSControl ("exit" or "error").
// A plain HTTP client streams a command's output this way, with TCP's back-pressure: a reader
// that stalls stalls the command, and one stalled longer than a minute ends it.
const ExecStreamType = "application/vnd.nexus.exec-stream"

// ChanExit is the last frame of an exec stream.
const ChanExit = 3

// execStreamFrame bounds one output frame (stream messages are smaller).
const execStreamFrame = 1 << 20

// exitControl is the last message of a streamed command: how it ended, or why nexus failed.
func exitControl(exit vmmapi.Exit, err error) WSControl {
	if err != nil {
		return WSControl{Type: "error", Code: errdefs.Code(err), Message: oneLine(err.Error())}
	}
	return WSControl{Type: "exit", ExitCode: exit.Code, Signal: exit.Signal, Error: oneLine(exit.Error)}
}

// frameWriter writes one channel's frames to the answer, each flushed, each under a write
// deadline; a failed write cancels the command.
type frameWriter struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	cancel context.CancelFunc
	failed bool
}

func (f *frameWriter) frame(ch byte, p []byte) error {
	if f.failed {
		return errdefs.Unavailable("exec stream: the client is gone")
	}
	var hdr [5]byte
	hdr[0] = ch
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	f.rc.SetWriteDeadline(time.Now().Add(wsPeerGone))
	_, err := f.w.Write(hdr[:])
	if err == nil {
		_, err = f.w.Write(p)
	}
	if err == nil {
		err = f.rc.Flush()
	}
	if err != nil {
		f.failed = true
		f.cancel()
	}
	return err
}

type chanFrames struct {
	f  *frameWriter
	ch byte
}

func (c chanFrames) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), execStreamFrame)
		if err := c.f.frame(c.ch, p[:k]); err != nil {
			return 0, err
		}
		p = p[k:]
	}
	return n, nil
}

// execStream runs a command and streams its output as frames (ExecStreamType). Errors before
// the command starts (a bad request, no sandbox) are ordinary HTTP errors.
func execStream(s *Service, w http.ResponseWriter, r *http.Request) error {
	var b ExecBody
	if err := decode(w, r, &b); err != nil {
		return err
	}
	if err := mcp.CheckCommand(b.Argv, b.Env, b.Stdin); err != nil {
		return err
	}
	if b.Timeout != "" {
		if d, err := time.ParseDuration(b.Timeout); err != nil || d <= 0 {
			return errdefs.Invalid("invalid timeout %q: use a duration like 30s", clip(b.Timeout))
		}
	}
	c, err := s.client(r.Context())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	fw := &frameWriter{w: w, rc: http.NewResponseController(w), cancel: cancel}
	req := api.ExecRequest{Name: r.PathValue("name"), Argv: b.Argv, Env: b.Env, Dir: b.Workdir, Timeout: b.Timeout, Stdin: b.Stdin != nil}
	pipes := api.IO{Stdout: chanFrames{fw, ChanStdout}, Stderr: chanFrames{fw, ChanStderr}}
	if b.Stdin != nil {
		pipes.Stdin = strings.NewReader(*b.Stdin)
	}
	started := false
	exec := func(ectx context.Context, req api.ExecRequest) (api.Started, error) {
		reply, err := c.Exec(ectx, req)
		if err != nil {
			return reply, err
		}
		started = true
		w.Header().Set("Content-Type", ExecStreamType)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
		return reply, fw.rc.Flush()
	}
	exit, err := api.RunSession(ctx, c.Conn(), req, exec, pipes)
	if !started {
		return err
	}
	msg, _ := json.Marshal(exitControl(exit, err))
	fw.frame(ChanExit, msg)
	return nil
}
