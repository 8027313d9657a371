package vmm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/stream"
	"github.com/IniZio/nexus/services/vmm/guest"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// MaxArgvBytes bounds the command line a caller may send.
const MaxArgvBytes = 256 << 10

// exec starts a guest process and relays it on the caller's stream session; the reply says it
// started. The process ends with the stream: a caller that vanishes has its process killed.
func (s *Service) exec(ctx context.Context, r api.ExecRequest) (api.Empty, error) {
	m, err := s.get(r.ID)
	if err != nil {
		return api.Empty{}, err
	}
	execDefaults(&r, s.imageConfig(m.dir))
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		return api.Empty{}, errdefs.Invalid("exec: the command is missing (nexus exec NAME CMD [ARGS…]) and the image has no Entrypoint or Cmd")
	}
	size := 0
	for _, a := range append(append([]string{}, r.Argv...), r.Env...) {
		size += len(a)
	}
	if size > MaxArgvBytes {
		return api.Empty{}, errdefs.Invalid("exec: command line and environment are %d bytes, more than %d", size, MaxArgvBytes)
	}
	var timeout time.Duration
	if r.Timeout != "" {
		if timeout, err = time.ParseDuration(r.Timeout); err != nil || timeout <= 0 {
			return api.Empty{}, errdefs.Invalid("exec: invalid --timeout %q", r.Timeout)
		}
	}
	sess, err := stream.Server(s.cfg.Bus, s.cfg.Host, r.SID)
	if err != nil {
		return api.Empty{}, err
	}
	es, err := m.agent.StartExec(context.Background(), guest.ExecRequest{
		Argv: r.Argv, Env: r.Env, Dir: r.Dir, TTY: r.TTY, Rows: r.Rows, Cols: r.Cols, Stdin: r.Stdin, User: r.User,
	})
	if err != nil {
		sess.Close()
		return api.Empty{}, fmt.Errorf("exec: %w", err)
	}
	m.execs.Add(1)
	go func() {
		defer m.execs.Add(-1)
		relayExec(sess, es, timeout)
	}()
	return api.Empty{}, nil
}

// relayExec pumps guest output to the stream and stream input to the guest until the process
// exits or the stream ends.
func relayExec(sess *stream.Session, es *guest.ExecSession, timeout time.Duration) {
	defer es.Close()
	// exited is closed once the process has ended: a stream that ends after that must not send
	// a kill (it would reach the process group, and with it the command's background children).
	exited := make(chan struct{})
	timedOut := make(chan struct{})
	if timeout > 0 {
		t := time.AfterFunc(timeout, func() {
			close(timedOut)
			killExec(es)
		})
		defer t.Stop()
	}
	go func() {
		// The caller is gone (its stream ended before the exit was sent): the process must not
		// outlive it, so a caller that retries never runs it twice. This watches the session,
		// not Recv, which may be held by a stdin write the process is not reading.
		select {
		case <-exited:
			return
		case <-sess.Done():
		}
		select {
		case <-exited:
			return
		default:
		}
		killExec(es)
		es.Close()
	}()
	go func() {
		for {
			msg, err := sess.Recv()
			if err != nil {
				return
			}
			switch msg.Kind {
			case stream.KindStdin:
				es.WriteStdin(msg.Data)
			case stream.KindStdinClose:
				es.CloseStdin()
			case stream.KindResize:
				var rs api.Resize
				if json.Unmarshal(msg.Data, &rs) == nil && rs.Rows > 0 && rs.Cols > 0 {
					es.Resize(rs.Rows, rs.Cols)
				}
			case stream.KindSignal:
				var sig int
				if json.Unmarshal(msg.Data, &sig) == nil && sig > 0 && sig < 65 {
					es.Signal(syscall.Signal(sig))
				}
			}
		}
	}()
	for {
		ev, err := es.Next()
		if err != nil {
			sess.Send(stream.KindExit, api.Exit{Code: api.ExitNexusFailed, Error: "exec: the guest agent channel broke: " + err.Error()})
			sess.Close()
			return
		}
		switch ev.Type {
		case guest.EventStdout:
			if sess.Write(stream.KindStdout, ev.Data) != nil {
				return
			}
		case guest.EventStderr:
			if sess.Write(stream.KindStderr, ev.Data) != nil {
				return
			}
		case guest.EventExit:
			close(exited)
			exit := api.Exit{Code: ev.Exit.Code, Signal: ev.Exit.Signal, Error: ev.Exit.Error}
			select {
			case <-timedOut:
				exit = api.Exit{Code: 124, Error: fmt.Sprintf("exec: timed out after %s", timeout)}
			default:
			}
			sess.Send(stream.KindExit, exit)
			sess.Close()
			return
		}
	}
}

// killExec kills a guest process whose caller is gone or whose time is up, over a stream of
// its own (the exec's stream may be held back by a stdin the process does not read), within
// execKillTimeout.
func killExec(es *guest.ExecSession) {
	ctx, cancel := context.WithTimeout(context.Background(), execKillTimeout)
	defer cancel()
	es.Kill(ctx)
}

// execKillTimeout bounds killExec.
const execKillTimeout = 5 * time.Second

// copy moves one file between host and guest over the caller's stream session.
func (s *Service) copy(ctx context.Context, r api.CopyRequest) (api.Empty, error) {
	m, err := s.get(r.ID)
	if err != nil {
		return api.Empty{}, err
	}
	if !strings.HasPrefix(r.Path, "/") {
		return api.Empty{}, errdefs.Invalid("cp: the guest path %q must be absolute", r.Path)
	}
	sess, err := stream.Server(s.cfg.Bus, s.cfg.Host, r.SID)
	if err != nil {
		return api.Empty{}, err
	}
	go func() {
		defer sess.Close()
		cctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var err error
		if r.ToGuest {
			pr, pw := io.Pipe()
			go func() {
				for {
					msg, err := sess.Recv()
					if err != nil {
						pw.CloseWithError(err)
						return
					}
					switch msg.Kind {
					case stream.KindStdin:
						if _, err := pw.Write(msg.Data); err != nil {
							return
						}
					case stream.KindStdinClose:
						pw.Close()
						return
					}
				}
			}()
			err = m.agent.CopyIn(cctx, agentproto.CopyInRequest{Path: r.Path, Mode: r.Mode, Size: r.Size, MkdirAll: true}, pr)
			pr.Close()
		} else {
			_, err = m.agent.CopyOut(cctx, r.Path, writerFunc(func(p []byte) (int, error) {
				return len(p), sess.Write(stream.KindStdout, p)
			}))
		}
		exit := api.Exit{}
		if err != nil {
			exit = api.Exit{Code: 1, Error: err.Error()}
		}
		sess.Send(stream.KindExit, exit)
	}()
	return api.Empty{}, nil
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// MaxLogChunk bounds one logs reply.
const MaxLogChunk = 1 << 20

// logs returns console output from a cursor (the guest kernel and agent print there), or the
// agent's own log ring.
func (s *Service) logs(ctx context.Context, r api.LogsRequest) (api.LogsResponse, error) {
	max := r.Max
	if max <= 0 || max > MaxLogChunk {
		max = MaxLogChunk
	}
	if r.Agent {
		m, err := s.get(r.ID)
		if err != nil {
			return api.LogsResponse{}, err
		}
		b, err := m.agent.Logs(ctx)
		if err != nil {
			return api.LogsResponse{}, err
		}
		if len(b) > max {
			b = b[len(b)-max:]
		}
		return api.LogsResponse{Data: b, NextOffset: int64(len(b))}, nil
	}
	f, err := os.Open(hypervisor.ConsoleLog(s.cfg.Home.Sandbox(r.ID)))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return api.LogsResponse{NextOffset: 0}, nil
		}
		return api.LogsResponse{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return api.LogsResponse{}, err
	}
	off := r.Offset
	if off < 0 || off > fi.Size() {
		off = 0 // the log was rotated by a restart: start over
	}
	n := min(fi.Size()-off, int64(max))
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return api.LogsResponse{}, err
	}
	return api.LogsResponse{Data: quietConsole(buf), NextOffset: off + n}, nil
}

// consoleNoise are kernel lines every boot prints that say nothing about the sandbox: the
// microvm machine has no PCI bus, which a distribution kernel reports as fatal (pci=off does
// not silence it).
var consoleNoise = [][]byte{[]byte("PCI: Fatal: No config space access function found")}

// quietConsole drops the whole lines of b that are consoleNoise (offsets stay the file's).
func quietConsole(b []byte) []byte {
	found := false
	for _, n := range consoleNoise {
		found = found || bytes.Contains(b, n)
	}
	if !found {
		return b
	}
	var out []byte
	for rest := b; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line = rest[:i+1]
		}
		rest = rest[len(line):]
		noise := false
		for _, n := range consoleNoise {
			noise = noise || bytes.Contains(line, n) && line[len(line)-1] == '\n'
		}
		if !noise {
			out = append(out, line...)
		}
	}
	return out
}

// mount mounts a host share in the guest: over virtiofs when the driver serves it so, else 9p.
// What the guest caches of a virtiofs share is virtiofsd's to say (its cache and timeout
// options, pinned by the driver); 9p's cache=mmap caches no metadata, so host edits show at once.
func (s *Service) mount(ctx context.Context, agent *guest.Client, tag string, m hypervisor.Mount) error {
	fstype, opts := "9p", "trans=virtio,version=9p2000.L,msize=262144,cache=mmap"
	if m.Virtiofs {
		fstype, opts = "virtiofs", "rw"
	}
	if m.ReadOnly {
		opts += ",ro"
	}
	var out bytes.Buffer
	st, err := agent.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", `mkdir -p "$1" && mount -t "$4" -o "$2" "$3" "$1"`, "sh", m.Guest, opts, tag, fstype}}, nil, &out, &out, nil)
	if err != nil {
		return err
	}
	if st.Code != 0 {
		return fmt.Errorf("mount %s at %s: %s", m.HostPath, m.Guest, strings.TrimSpace(out.String()))
	}
	return nil
}

// wantsVirtiofs says whether a share should be served over virtiofs. Only a sandbox's --mount
// worktrees are: the profile's live mounts (Remount) stay on 9p so the sandbox can still be
// snapshotted and forked (QEMU 7.2 cannot migrate a vhost-user-fs device, and a fork's RAM is
// mapped privately where vhost-user needs it shared); a read-only share stays on 9p, whose
// read-only export QEMU enforces (7.2's virtiofsd has none); and a guest whose commands run as a
// user other than root stays on 9p, because virtiofsd runs as the share's owner mapped to root
// in a user namespace and cannot create files for any other guest uid.
func wantsVirtiofs(m api.Mount, asRoot bool) bool {
	return !m.Remount && !m.ReadOnly && asRoot
}
