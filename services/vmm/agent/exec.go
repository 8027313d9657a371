package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/hashicorp/yamux"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// outputGrace is how long exec keeps reading stdout/stderr after the process exited, for bytes
// still in the pipe; a background child holding the pipe open does not hold the exit report longer.
const outputGrace = 2 * time.Second

// outputChunk is the read size of the stdout/stderr pumps (one frame per read).
const outputChunk = 32 << 10

func (s *Server) handleExec(ctx context.Context, st *yamux.Stream, req *agentproto.ExecRequest) {
	defer st.Close()
	if err := validateExec(req); err != nil {
		s.replyErr(st, err)
		return
	}
	s.reply(st, agentproto.Response{})
	s.lookAgain(true)
	defer s.lookAgain(true)
	fw := agentproto.NewFrameWriter(st)
	e := &execution{s: s, st: st, fw: fw, req: req}
	code, sig := e.run()
	fw.WriteFrame(agentproto.FrameExit, agentproto.EncodeExit(code, sig))
}

func validateExec(req *agentproto.ExecRequest) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return errInvalid("exec: empty command")
	}
	for _, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errInvalid("exec: argument contains a NUL byte")
		}
	}
	for _, kv := range req.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !validEnvKey(k) || !validEnvValue(v) {
			return errInvalid(fmt.Sprintf("exec: bad environment entry %.40q", kv))
		}
	}
	return nil
}

type execution struct {
	s   *Server
	st  *yamux.Stream
	fw  *agentproto.FrameWriter
	req *agentproto.ExecRequest
	// exited is set once the process was reaped: the host closing the stream after that is the
	// normal end, before it the caller is gone and the process must not outlive it.
	exited atomic.Bool
}

// execKey names a running exec for exec-kill: its stream in its host session (stream ids are
// only unique within one session).
type execKey struct {
	sess *yamux.Session
	id   uint32
}

// trackExec makes the exec on st killable by exec-kill until the returned func is called.
func (s *Server) trackExec(st *yamux.Stream, pid int) func() {
	k := execKey{st.Session(), st.StreamID()}
	s.mu.Lock()
	s.execs[k] = pid
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.execs, k)
		s.mu.Unlock()
	}
}

// killExec kills the process group of the exec on stream id of sess, if it still runs.
func (s *Server) killExec(sess *yamux.Session, id uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pid, ok := s.execs[execKey{sess, id}]; ok {
		s.log.Debug().Int("pid", pid).Msg("exec killed by its host")
		syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// fail reports a start failure the way a shell would: an error frame and 127 (not found) or 126.
func (e *execution) fail(err error, code int32) (int32, uint32) {
	e.fw.WriteFrame(agentproto.FrameError, []byte(oneLine(err.Error())))
	return code, 0
}

func (e *execution) run() (int32, uint32) {
	req := e.req
	env := e.s.buildEnv(req)
	dir := req.Dir
	if dir == "" {
		dir = e.s.cfg.Dir
	}
	path, err := lookPath(req.Argv[0], envGet(env, "PATH"), dir)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return e.fail(err, 127)
		}
		return e.fail(err, 126)
	}
	cmd := &exec.Cmd{Path: path, Args: req.Argv, Env: env, Dir: dir, SysProcAttr: &syscall.SysProcAttr{}}
	if req.User != "" {
		cred, home, err := lookupUser(req.User)
		if err != nil {
			return e.fail(err, 126)
		}
		cmd.SysProcAttr.Credential = cred
		if home != "" && envGet(req.Env, "HOME") == "" {
			cmd.Env = envSet(cmd.Env, "HOME", home)
		}
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return e.fail(fmt.Errorf("exec: working directory %q does not exist", dir), 126)
	}

	var (
		outputs []*os.File // read ends the pumps read
		stdin   *os.File   // write end fed from stdin frames
		ptmx    *os.File
		toClose []*os.File // child ends, closed after start
	)
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	if req.TTY {
		m, tty, err := pty.Open()
		if err != nil {
			return e.fail(fmt.Errorf("exec: open pty: %w", err), 126)
		}
		rows, cols := req.Rows, req.Cols
		if rows == 0 || cols == 0 {
			rows, cols = 24, 80
		}
		pty.Setsize(m, &pty.Winsize{Rows: rows, Cols: cols})
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr.Setsid = true
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0
		ptmx = m
		outputs = []*os.File{m}
		toClose = []*os.File{tty}
	} else {
		cmd.SysProcAttr.Setpgid = true
		or, ow, err := os.Pipe()
		if err != nil {
			return e.fail(fmt.Errorf("exec: pipe: %w", err), 126)
		}
		er, ew, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{or, ow})
			return e.fail(fmt.Errorf("exec: pipe: %w", err), 126)
		}
		cmd.Stdout, cmd.Stderr = ow, ew
		outputs = []*os.File{or, er}
		toClose = []*os.File{ow, ew}
		if req.Stdin {
			ir, iw, err := os.Pipe()
			if err != nil {
				closeAll(append(outputs, toClose...))
				return e.fail(fmt.Errorf("exec: pipe: %w", err), 126)
			}
			cmd.Stdin = ir
			stdin = iw
			toClose = append(toClose, ir)
		}
	}
	wait, err := e.s.startProcess(cmd)
	closeAll(toClose)
	if err != nil {
		closeAll(outputs)
		if stdin != nil {
			stdin.Close()
		}
		code := int32(126)
		if errors.Is(err, fs.ErrNotExist) {
			code = 127
		}
		return e.fail(fmt.Errorf("exec: %q: %w", req.Argv[0], unwrapPathErr(err)), code)
	}
	pid := cmd.Process.Pid
	e.s.log.Debug().Str(logArgv0, req.Argv[0]).Int("pid", pid).Msg("exec started")
	untrack := e.s.trackExec(e.st, pid)

	// Output pumps: one frame per read, straight from the pipe into the frame buffer.
	var pumps sync.WaitGroup
	types := []agentproto.FrameType{agentproto.FrameStdout, agentproto.FrameStderr}
	for i, f := range outputs {
		pumps.Add(1)
		go func(f *os.File, t agentproto.FrameType) {
			defer pumps.Done()
			buf := make([]byte, agentproto.FrameHeaderLen+outputChunk)
			for {
				n, err := f.Read(buf[agentproto.FrameHeaderLen:])
				if n > 0 {
					if werr := e.fw.WriteHeaded(t, buf[:agentproto.FrameHeaderLen+n]); werr != nil {
						// The host is gone: nobody will see this process again.
						syscall.Kill(-pid, syscall.SIGKILL)
						return
					}
				}
				if err != nil {
					return // EOF, or EIO on a pty master once the last slave fd closed
				}
			}
		}(f, types[i])
	}

	// Input: frames from the host.
	inputDone := make(chan struct{})
	go func() {
		defer close(inputDone)
		e.readInput(pid, stdin, ptmx)
	}()

	ws := wait()
	untrack()
	e.exited.Store(true)
	pumpsDone := make(chan struct{})
	go func() { pumps.Wait(); close(pumpsDone) }()
	select {
	case <-pumpsDone:
	case <-time.After(outputGrace):
		// A background process still holds the output open; stop reading it.
		closeAll(outputs)
		<-pumpsDone
	}
	closeAll(outputs)
	if stdin != nil && ptmx == nil {
		// readInput may still hold it; closing makes its writes fail fast.
		stdin.Close()
	}
	code, sig := exitOf(ws)
	e.s.log.Debug().Str(logArgv0, req.Argv[0]).Int("pid", pid).Int32("code", code).Msg("exec ended")
	return code, sig
}

// readInput applies host frames until the host half-closes or the stream breaks.
func (e *execution) readInput(pid int, stdin, ptmx *os.File) {
	in := stdin
	if ptmx != nil {
		in = ptmx
	}
	// Stdin is written by its own goroutine so a process not reading its stdin does not hold
	// back resize and signal frames; the queue is bounded (backpressure to the host).
	queue := make(chan []byte, 16)
	var wg sync.WaitGroup
	if in != nil && (e.req.Stdin || ptmx != nil) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			broken := false
			for b := range queue {
				if b == nil {
					if ptmx == nil {
						in.Close()
					} else {
						in.Write([]byte{4}) // ^D: end of input on a terminal
					}
					continue
				}
				if !broken {
					if _, err := in.Write(b); err != nil {
						broken = true
					}
				}
			}
		}()
	}
	defer func() {
		close(queue)
		wg.Wait()
	}()
	// A process that reads none of its stdin holds the queue full, and this loop then reads no
	// more frames, so it would never see the host go away: the end of the host's session is
	// watched meanwhile, and kills the process (nobody will see it again).
	var hostGone <-chan struct{}
	if sess := e.st.Session(); sess != nil {
		hostGone = sess.CloseChan()
	}
	send := func(b []byte) bool {
		select {
		case queue <- b:
			return true
		case <-hostGone:
			e.s.log.Debug().Msg("exec input: the host's session ended while stdin was held back")
			syscall.Kill(-pid, syscall.SIGKILL)
			return false
		}
	}
	br := bufio.NewReaderSize(e.st, 64<<10)
	buf := make([]byte, agentproto.MaxFramePayload)
	stdinClosed := false
	for {
		t, p, err := agentproto.ReadFrame(br, buf)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) && (!isEOF(err) || !e.exited.Load()) {
				// Broken stream, a malformed frame, or the host closing before the exit: the
				// session for this process is gone.
				e.s.log.Debug().Err(err).Msg("exec input")
				syscall.Kill(-pid, syscall.SIGKILL)
			}
			if !stdinClosed && ptmx == nil && in != nil {
				send(nil)
			}
			return
		}
		switch t {
		case agentproto.FrameStdin:
			if in != nil && !stdinClosed && !send(slices.Clone(p)) {
				return
			}
		case agentproto.FrameStdinClose:
			if in != nil && !stdinClosed {
				stdinClosed = true
				if !send(nil) {
					return
				}
			}
		case agentproto.FrameResize:
			if ptmx != nil {
				rows, cols := agentproto.DecodeResize(p)
				pty.Setsize(ptmx, &pty.Winsize{Rows: rows, Cols: cols})
			}
		case agentproto.FrameSignal:
			sig := syscall.Signal(agentproto.DecodeSignal(p))
			if sig > 0 && sig < 65 {
				if syscall.Kill(-pid, sig) != nil {
					syscall.Kill(pid, sig)
				}
			}
		default:
			e.s.log.Debug().Stringer("type", t).Msg("exec: unexpected frame ignored")
		}
	}
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) || errors.Is(err, yamux.ErrStreamClosed)
}

func errInvalid(msg string) error { return errdefs.New(errdefs.ErrInvalid, msg) }

func exitOf(ws syscall.WaitStatus) (int32, uint32) {
	switch {
	case ws.Exited():
		return int32(ws.ExitStatus()), 0
	case ws.Signaled():
		return 128 + int32(ws.Signal()), uint32(ws.Signal())
	}
	return 255, 0
}

// buildEnv layers: base env, PATH default, configure's env, the request's env (last wins).
func (s *Server) buildEnv(req *agentproto.ExecRequest) []string {
	env := append([]string(nil), s.cfg.Env...)
	if envGet(env, "PATH") == "" {
		env = envSet(env, "PATH", DefaultPath)
	}
	if envGet(env, "HOME") == "" {
		env = envSet(env, "HOME", "/root")
	}
	s.mu.Lock()
	keys := make([]string, 0, len(s.env))
	for k := range s.env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = envSet(env, k, s.env[k])
	}
	s.mu.Unlock()
	for _, kv := range req.Env {
		k, v, _ := strings.Cut(kv, "=")
		env = envSet(env, k, v)
	}
	if req.TTY && envGet(env, "TERM") == "" {
		env = envSet(env, "TERM", "xterm-256color")
	}
	return env
}

func envGet(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

func envSet(env []string, key, val string) []string {
	for i, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok && k == key {
			env[i] = key + "=" + val
			return env
		}
	}
	return append(env, key+"="+val)
}

// lookPath resolves name against the PATH of the process's own environment (not the agent's).
func lookPath(name, path, dir string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("exec: %q: %w", name, unwrapPathErr(err))
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("exec: %q: %w", name, fs.ErrPermission)
		}
		return name, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &exec.Error{Name: name, Err: exec.ErrNotFound}
}

func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// userDB is where user and group names are looked up: the guest's /etc/passwd and /etc/group
// (os/user), or a test's table.
type userDB struct {
	lookup      func(name string) (*user.User, error)
	lookupID    func(uid string) (*user.User, error)
	lookupGroup func(name string) (*user.Group, error)
	groupIDs    func(u *user.User) ([]string, error)
}

var systemUsers = userDB{user.Lookup, user.LookupId, user.LookupGroup, (*user.User).GroupIds}

// lookupUser resolves "name", "uid", "name:group" or "uid:gid" in the guest's user database.
func lookupUser(spec string) (*syscall.Credential, string, error) {
	return systemUsers.resolve(spec)
}

// resolve resolves a USER[:GROUP] spec as docker does. A numeric uid or gid needs no entry:
// without one the gid is the uid's and HOME is /. root is uid 0 on every Linux, so "root" (and
// its group) resolve to 0 in an image that has no /etc/passwd, or one that leaves root out; any
// other name that is not in the database is an error.
func (db userDB) resolve(spec string) (*syscall.Credential, string, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	if name == "" || (hasGroup && group == "") {
		return nil, "", fmt.Errorf("exec: bad user %.40q: give USER[:GROUP]", spec)
	}
	var u *user.User
	var err error
	known := true
	if _, nerr := strconv.ParseUint(name, 10, 32); nerr == nil {
		if u, err = db.lookupID(name); err != nil {
			u, known = &user.User{Uid: name, Gid: name, HomeDir: "/"}, false
			if name == "0" {
				u.HomeDir = "/root"
			}
		}
	} else if u, err = db.lookup(name); err != nil {
		if name != "root" {
			return nil, "", fmt.Errorf("exec: unknown user %.40q", name)
		}
		u, known = &user.User{Uid: "0", Gid: "0", Username: "root", HomeDir: "/root"}, false
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, "", fmt.Errorf("exec: user %.40q has no numeric ids", name)
	}
	if hasGroup {
		if g, err := strconv.ParseUint(group, 10, 32); err == nil {
			gid = g
		} else if grp, err := db.lookupGroup(group); err == nil {
			g, err := strconv.ParseUint(grp.Gid, 10, 32)
			if err != nil {
				return nil, "", fmt.Errorf("exec: group %.40q has no numeric id", group)
			}
			gid = g
		} else if group == "root" {
			gid = 0
		} else {
			return nil, "", fmt.Errorf("exec: unknown group %.40q", group)
		}
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if known {
		if ids, err := db.groupIDs(u); err == nil {
			for _, id := range ids {
				if g, err := strconv.ParseUint(id, 10, 32); err == nil {
					cred.Groups = append(cred.Groups, uint32(g))
				}
			}
		}
	}
	return cred, u.HomeDir, nil
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 1024 {
		s = s[:1024]
	}
	return s
}
