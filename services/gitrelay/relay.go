package gitrelay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gitrelay"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/httppolicy"
	"github.com/IniZio/nexus/pkg/pktline"
)

// exitRefused is the exit code the guest's ssh shim returns for a refusal or a relay failure
// (ssh's own code for its errors).
const exitRefused = 255

// Timeouts of a session.
const (
	helloTimeout  = 10 * time.Second // the shim sends its hello right after connecting
	lingerTimeout = 10 * time.Second // after the exit frame, for the shim to read it and hang up
)

// Audit rules of the relay's decisions.
const (
	RuleCommand     = "git_ssh_command"   // not exactly git-upload-pack/git-receive-pack of owner/repo
	RuleRepo        = "git_ssh_repo"      // repo outside --repo and egress.policy
	RulePushBranch  = "push_branch"       // a ref update outside the allowed branches
	RuleBadPush     = "push_malformed"    // the push's command section did not parse
	RuleRelay       = "git_ssh_relay"     // allowed and relayed
	RuleUnavailable = "git_ssh_no_record" // the sandbox record could not be read
)

// session is one relayed ssh invocation.
type session struct {
	s   *Service
	l   *listener
	c   *net.UnixConn
	fr  *api.FrameReader
	out *lockedWriter
	ev  audit.Event
}

// lockedWriter serialises frames from ssh's stdout and stderr copiers onto the connection.
type lockedWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.w.Write(p)
	w.err = err
	return n, err
}

func (s *Service) serve(ctx context.Context, l *listener, c *net.UnixConn) {
	defer c.Close()
	ss := &session{s: s, l: l, c: c, fr: api.NewFrameReader(c), out: &lockedWriter{w: c},
		ev: audit.Event{Sandbox: l.id, Name: l.name, Layer: audit.LayerGit, Proto: "ssh"}}
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	typ, p, err := ss.fr.Next(api.MaxHello)
	if err != nil || typ != api.FrameHello {
		s.log.Debug().Err(err).Str(logSandbox, l.name).Msg("gitrelay: session without a hello")
		return
	}
	var hello api.Hello
	if err := json.Unmarshal(p, &hello); err != nil {
		ss.refuse(RuleCommand, "nexus: refused: the ssh shim sent a malformed request")
		return
	}
	c.SetReadDeadline(time.Time{})
	cmd, err := ParseCommand(hello.Args)
	if err != nil {
		ss.refuse(RuleCommand, err.Error())
		return
	}
	ss.ev.Host, ss.ev.Port, ss.ev.Method, ss.ev.Path = cmd.Host, cmd.Port, cmd.Service, cmd.Repo
	rec, err := s.cfg.Records(ctx, l.name)
	if err == nil && rec.ID != l.id {
		err = errors.New("the record belongs to another sandbox of that name")
	}
	if err != nil {
		s.log.Warn().Err(err).Str(logSandbox, l.name).Msg("gitrelay: sandbox record")
		ss.refuse(RuleUnavailable, "nexus: git relay: this sandbox's record is unavailable; try again")
		return
	}
	pol, err := PolicyOf(rec)
	if err != nil {
		s.log.Warn().Err(err).Str(logSandbox, l.name).Msg("gitrelay: sandbox policy")
		ss.refuse(RuleUnavailable, "nexus: git relay: this sandbox's policy is invalid")
		return
	}
	if !pol.RepoAllowed(cmd.Host, cmd.Repo) {
		ss.refuse(RuleRepo, RepoRefusal(cmd.Host, cmd.Repo).Error())
		return
	}
	proto := hello.GitProtocol
	if !gitProtocolRE.MatchString(proto) {
		proto = "" // not what git sends: the remote gets the default protocol
	}
	ss.relay(ctx, cmd, pol, proto)
}

// refuse tells the guest why (one line on git's stderr, exit 255) and records the denial.
func (ss *session) refuse(rule, msg string) {
	ss.ev.Decision, ss.ev.Rule, ss.ev.Reason = audit.Deny, rule, msg
	ss.s.cfg.Audit.Emit(context.Background(), ss.ev)
	ss.s.log.Info().Str(logSandbox, ss.l.name).Str("rule", rule).Str("reason", msg).Msg("gitrelay: refused")
	ss.finish(exitRefused, msg, true)
}

// finish writes an optional stderr line and the exit frame, half-closes, and waits (bounded)
// for the shim to hang up, so that the last frames are not lost to a connection closed under
// them. With drain, finish itself discards what the shim still sends; otherwise the caller's
// stdin pump is still reading and ends when the shim hangs up or the deadline passes.
func (ss *session) finish(code int, line string, drain bool) {
	ss.c.SetWriteDeadline(time.Now().Add(lingerTimeout))
	if line != "" {
		api.WriteFrame(ss.out, api.FrameStderr, []byte(line+"\n"))
	}
	api.WriteFrame(ss.out, api.FrameExit, api.ExitPayload(code))
	ss.c.CloseWrite()
	ss.c.SetReadDeadline(time.Now().Add(lingerTimeout))
	if drain {
		io.Copy(io.Discard, ss.c)
	}
}

// stdinReader yields the guest's stdin frames as a stream; FrameStdinEOF is io.EOF.
type stdinReader struct {
	fr      *api.FrameReader
	pending []byte
	eof     bool
	n       atomic.Int64
}

func (r *stdinReader) Read(p []byte) (int, error) {
	for len(r.pending) == 0 {
		if r.eof {
			return 0, io.EOF
		}
		typ, payload, err := r.fr.Next(api.MaxFrame)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // the shim hung up without ending stdin
			}
			return 0, err
		}
		switch typ {
		case api.FrameStdin:
			r.pending = payload
		case api.FrameStdinEOF:
			r.eof = true
		default:
			return 0, fmt.Errorf("%w: unexpected frame %q from the guest", api.ErrFrame, typ)
		}
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	r.n.Add(int64(n))
	return n, nil
}

// relay runs the host's ssh for an allowed command and relays both ways; on a push it holds
// the ref updates to the allowed branches before forwarding them.
func (ss *session) relay(ctx context.Context, cmd Command, pol *Policy, proto string) {
	s := ss.s
	sctx, kill := context.WithCancel(ctx)
	defer kill()
	x := exec.CommandContext(sctx, s.cfg.SSH.Binary, s.cfg.SSH.Argv(cmd)...)
	x.Env = append([]string{}, s.cfg.SSH.Env...)
	if proto != "" {
		x.Env = append(x.Env, "GIT_PROTOCOL="+proto)
	}
	x.WaitDelay = 5 * time.Second
	x.Stderr = api.FrameWriter{W: ss.out, Typ: api.FrameStderr}
	stdin, err := x.StdinPipe()
	var stdout io.ReadCloser
	if err == nil {
		stdout, err = x.StdoutPipe()
	}
	if err == nil {
		err = x.Start()
	}
	if err != nil {
		s.log.Warn().Err(err).Str("ssh", s.cfg.SSH.Binary).Msg("gitrelay: cannot run ssh")
		ss.ev.Decision, ss.ev.Rule, ss.ev.Reason = audit.Allow, RuleRelay, "allowed, but the host's ssh could not be started"
		ss.ev.Status = exitRefused
		s.cfg.Audit.Emit(context.Background(), ss.ev)
		ss.finish(exitRefused, "nexus: git relay: the host's ssh could not be started", true)
		return
	}
	in := &stdinReader{fr: ss.fr}
	// The pump's verdict on a push, published before it acts on it (kill or forward), so it is
	// there once ssh has ended.
	var verdict atomic.Pointer[pushVerdict]
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		defer stdin.Close()
		if cmd.Service == ReceivePack {
			req, raw, err := pktline.ReadUpdateRequest(in, pktline.Limits{MaxBytes: httppolicy.MaxPushCommands})
			v := judgePush(req, err, pol)
			verdict.Store(v)
			if v.msg != "" {
				// Nothing of the commands reaches the remote: ssh is killed with its stdin
				// untouched, so receive-pack sees no update request at all.
				kill()
				return
			}
			if _, err := stdin.Write(raw); err != nil {
				kill()
				return
			}
		}
		if _, err := io.Copy(stdin, in); err != nil {
			kill() // the guest went away mid-stream
		}
	}()
	// ssh's stdout → the guest, in frames of up to 64 KiB; read to the end before Wait.
	outBytes, cerr := api.CopyFrames(ss.out, api.FrameStdout, stdout)
	if cerr != nil {
		kill() // the guest went away: stop the remote side too
		io.Copy(io.Discard, stdout)
	}
	werr := x.Wait()
	code := 0
	if werr != nil {
		code = exitRefused
		var ee *exec.ExitError
		if errors.As(werr, &ee) && ee.ExitCode() >= 0 {
			code = ee.ExitCode()
		}
	}
	v := verdict.Load()
	if v != nil && v.msg != "" {
		<-pumped // it returned right after deciding
		ss.ev.Bytes = outBytes + in.n.Load()
		ss.ev.Decision, ss.ev.Rule, ss.ev.Reason = audit.Deny, v.rule, v.msg
		s.cfg.Audit.Emit(context.Background(), ss.ev)
		s.log.Info().Str(logSandbox, ss.l.name).Str("rule", v.rule).Str("reason", v.msg).Msg("gitrelay: refused")
		ss.finish(exitRefused, v.msg, true)
		return
	}
	// Otherwise the pump may still wait on the guest (the remote ended first): the exit frame
	// lets the shim hang up, which ends it.
	ss.ev.Bytes = outBytes + in.n.Load()
	ss.ev.Decision, ss.ev.Rule, ss.ev.Status = audit.Allow, RuleRelay, code
	ss.ev.Reason = fmt.Sprintf("%s of %s on %s relayed", cmd.Service, cmd.Repo, cmd.Host)
	if v != nil {
		ss.ev.Reason += fmt.Sprintf("; refs [%s] within %s", strings.Join(v.refs, " "), strings.Join(pol.Branches, ", "))
	}
	s.cfg.Audit.Emit(context.Background(), ss.ev)
	ss.finish(code, "", false)
	<-pumped
}

// pushVerdict is the judgement of a push's update request: a refusal (rule and the line for
// git's stderr) or the refs it may update.
type pushVerdict struct {
	rule, msg string
	refs      []string
}

// judgePush holds a parsed update request to the allowed branches.
func judgePush(req *pktline.UpdateRequest, err error, pol *Policy) *pushVerdict {
	switch {
	case errors.Is(err, pktline.ErrSignedPush):
		return &pushVerdict{rule: RuleBadPush, msg: "nexus: refused: signed pushes (git push --signed) are not supported"}
	case errors.Is(err, pktline.ErrTooLarge):
		return &pushVerdict{rule: RuleBadPush, msg: "nexus: refused: push updates too many refs at once"}
	case err != nil:
		return &pushVerdict{rule: RuleBadPush, msg: "nexus: refused: malformed git push request"}
	}
	v := &pushVerdict{}
	for _, c := range req.Commands {
		if !pol.BranchAllowed(c.Ref) {
			return &pushVerdict{rule: RulePushBranch, msg: RefRefusal(c.Ref).Error()}
		}
		v.refs = append(v.refs, c.Ref)
	}
	return v
}
