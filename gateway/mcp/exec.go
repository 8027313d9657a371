package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/ring"
)

const (
	// OutputLimit is how much of each of stdout and stderr a result keeps: its first and its
	// last OutputLimit/2 bytes when there is more (each cut back to a UTF-8 boundary), joined by
	// an omission line. The *_bytes fields count everything the command wrote.
	OutputLimit = 64 << 10
	// DefaultExecTimeout kills a command that runs longer when the caller gave no timeout.
	DefaultExecTimeout = 10 * time.Minute
	// MaxExecTimeout is the longest timeout a caller may ask for.
	MaxExecTimeout = 24 * time.Hour
	// MaxStdin bounds the stdin text a caller may send.
	MaxStdin = 8 << 20
	// runLabel marks a sandbox made by sandbox_run with a nonce, so that its cleanup removes only
	// the sandbox it made (never one that already had the name).
	runLabel = "nexus.run"
)

// ExecResult is the result of sandbox_exec and sandbox_run.
type ExecResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	// StdoutOmitted and StderrOmitted count the bytes cut from the middle of a truncated stream.
	StdoutOmitted int64 `json:"stdout_omitted,omitempty"`
	StderrOmitted int64 `json:"stderr_omitted,omitempty"`
	Signal        int   `json:"signal,omitempty"`
	// Error says why the command did not run or did not finish (not found, timed out), as the
	// guest agent or the vmm said.
	Error string `json:"error,omitempty"`
	// Sandbox and RemoveError are set by sandbox_run.
	Sandbox     string `json:"sandbox,omitempty"`
	RemoveError string `json:"remove_error,omitempty"`
}

// capture keeps the first and the last limit/2 bytes written to it and counts them all.
type capture struct {
	head  []byte
	tail  *ring.Ring // the last limit/2 bytes once head is full
	total int64
	limit int
}

func (c *capture) Write(p []byte) (int, error) {
	c.total += int64(len(p))
	if c.tail == nil && len(c.head)+len(p) <= c.limit {
		c.head = append(c.head, p...) // everything so far fits
		return len(p), nil
	}
	if c.tail == nil {
		// Over the limit for the first time: the head keeps half, the rest starts the tail.
		half := c.limit / 2
		c.tail = ring.New(c.limit - half)
		c.tail.Write(c.head[half:])
		c.head = c.head[:half:half]
	}
	c.tail.Write(p)
	return len(p), nil
}

func (c *capture) truncated() bool { return c.total > int64(c.limit) }

// parts returns the kept head and tail, neither with a rune cut in half (tail is nil when
// nothing was cut).
func (c *capture) parts() (head, tail []byte) {
	if !c.truncated() {
		return c.head, nil
	}
	head = c.head[:len(c.head)-partialTail(c.head)]
	tail = c.tail.Bytes()
	for i := 0; i < utf8.UTFMax-1 && len(tail) > 0 && !utf8.RuneStart(tail[0]); i++ {
		tail = tail[1:]
	}
	return head, tail
}

// text returns what was kept: all of it, or the head, an omission line and the tail.
func (c *capture) text() string {
	head, tail := c.parts()
	if tail == nil {
		return string(head)
	}
	return fmt.Sprintf("%s\n[nexus: %d bytes omitted]\n%s", head, c.omitted(), tail)
}

// omitted is how many of the bytes written text leaves out.
func (c *capture) omitted() int64 {
	head, tail := c.parts()
	if tail == nil {
		return 0
	}
	return c.total - int64(len(head)) - int64(len(tail))
}

type execArgs struct {
	Name    string   `json:"name"`
	Argv    []string `json:"argv"`
	Env     []string `json:"env"`
	Workdir string   `json:"workdir"`
	Stdin   *string  `json:"stdin"`
	Timeout string   `json:"timeout"`
}

// execTimeout validates a caller's timeout; empty means DefaultExecTimeout.
func execTimeout(s string) (time.Duration, error) {
	if s == "" {
		return DefaultExecTimeout, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > MaxExecTimeout {
		return 0, errdefs.Invalid("invalid timeout %q: use a duration like 30s or 5m, at most %s", s, MaxExecTimeout)
	}
	return d, nil
}

func checkCommand(argv, env []string, stdin *string) error {
	if len(argv) == 0 || argv[0] == "" {
		return errdefs.Invalid("argv is required: the command and its arguments, e.g. [\"sh\",\"-c\",\"echo hi\"]")
	}
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return errdefs.Invalid("invalid env entry %q: use KEY=VALUE", e)
		}
	}
	if stdin != nil && len(*stdin) > MaxStdin {
		return errdefs.Invalid("stdin is %d bytes, more than %d", len(*stdin), MaxStdin)
	}
	return nil
}

func (s *Server) sandboxExec(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a execArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Name == "" {
		return nil, errdefs.Invalid("name is required")
	}
	if err := checkCommand(a.Argv, a.Env, a.Stdin); err != nil {
		return nil, err
	}
	timeout, err := execTimeout(a.Timeout)
	if err != nil {
		return nil, err
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	return runCommand(ctx, c, api.ExecRequest{Name: a.Name, Argv: a.Argv, Env: a.Env, Dir: a.Workdir}, a.Stdin, timeout)
}

// runCommand runs one command in a sandbox and collects its output. The guest kills the
// command when timeout passes (exit code 124); the host gives up a little later.
func runCommand(ctx context.Context, c *api.Client, req api.ExecRequest, stdin *string, timeout time.Duration) (*ExecResult, error) {
	req.Timeout = timeout.String()
	req.Stdin = stdin != nil
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	stdout := &capture{limit: OutputLimit}
	stderr := &capture{limit: OutputLimit}
	pipes := api.IO{Stdout: stdout, Stderr: stderr}
	if stdin != nil {
		pipes.Stdin = strings.NewReader(*stdin)
	}
	exit, err := c.Run(ctx, req, pipes)
	if err != nil {
		switch {
		case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
			return nil, errdefs.Unavailable("exec in %s: no exit status %s after the timeout: the sandbox stopped answering", req.Name, 30*time.Second)
		case ctx.Err() != nil:
			return nil, fmt.Errorf("exec in %s: cancelled", req.Name)
		}
		return nil, fmt.Errorf("exec in %s: %w", req.Name, err)
	}
	return &ExecResult{
		ExitCode: exit.Code, Signal: exit.Signal, Error: oneLine(exit.Error),
		Stdout: stdout.text(), StdoutBytes: stdout.total, StdoutTruncated: stdout.truncated(), StdoutOmitted: stdout.omitted(),
		Stderr: stderr.text(), StderrBytes: stderr.total, StderrTruncated: stderr.truncated(), StderrOmitted: stderr.omitted(),
	}, nil
}

type runArgs struct {
	Image   string   `json:"image"`
	Argv    []string `json:"argv"`
	Memory  int      `json:"memory"`
	VCPUs   int      `json:"vcpus"`
	Project string   `json:"project"`
	Name    string   `json:"name"`
	Env     []string `json:"env"`
	Stdin   *string  `json:"stdin"`
	Timeout string   `json:"timeout"`
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// sandboxRun creates a sandbox, runs one command and removes the sandbox whatever happened.
func (s *Server) sandboxRun(ctx context.Context, req mcpgo.CallToolRequest) (res any, err error) {
	var a runArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Image == "" {
		return nil, errdefs.Invalid("image is required, e.g. nexus-base or nexus-mini")
	}
	argv := a.Argv
	if len(argv) == 0 { // the image's Entrypoint and Cmd, checked once the image is known
		argv = []string{"image default"}
	}
	if err := checkCommand(argv, a.Env, a.Stdin); err != nil {
		return nil, err
	}
	timeout, err := execTimeout(a.Timeout)
	if err != nil {
		return nil, err
	}
	if a.Name == "" {
		a.Name = "run-" + randomHex(4)
	}
	name, err := api.FullName(a.Project, a.Name)
	if err != nil {
		return nil, err
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	if len(a.Argv) == 0 {
		// An image here already says what it runs; one pulled by the create is checked by the
		// vmm, which refuses an exec with nothing to run.
		if img, err := c.Image(ctx, vmmapi.ImageRequest{Op: "inspect", Name: a.Image}); err == nil && len(img.Entrypoint)+len(img.Cmd) == 0 {
			return nil, errdefs.Invalid("argv is empty and image %s has no Entrypoint or Cmd: give the command, e.g. [\"sh\",\"-c\",\"echo hi\"]", a.Image)
		}
	}
	nonce := randomHex(8)
	defer func() {
		// Its own context: the caller's may be what ended (timeout, cancel).
		rerr := s.removeOwned(name, runLabel, nonce)
		if rerr == nil {
			return
		}
		if r, ok := res.(*ExecResult); ok && err == nil {
			r.RemoveError = oneLine(rerr.Error())
			return
		}
		if err != nil {
			err = fmt.Errorf("%w (and removing the sandbox failed: %v)", err, rerr)
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, api.CreateTimeout)
	_, err = c.Create(cctx, s.adjustCreate(ctx, api.CreateRequest{Name: name, Image: a.Image, MemoryMiB: a.Memory, VCPUs: a.VCPUs,
		Labels: map[string]string{runLabel: nonce}}))
	cancel()
	if err != nil {
		return nil, err
	}
	out, err := runCommand(ctx, c, api.ExecRequest{Name: name, Argv: a.Argv, Env: a.Env}, a.Stdin, timeout)
	if err != nil {
		return nil, err
	}
	out.Sandbox = name
	return out, nil
}

// removeOwned removes sandbox name if its label key holds value (it is the one we made). A
// sandbox that is already gone is fine.
func (s *Server) removeOwned(name, key, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	sb, err := c.Get(ctx, name)
	if mine, err := api.Owned(sb, err, key, value); !mine {
		return err
	}
	res, err := c.Apply(ctx, api.Remove, api.NamesRequest{Names: []string{name}, Force: true})
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Error != "" && r.Code != errdefs.CodeNotFound {
			return errdefs.FromCode(r.Code, r.Error)
		}
	}
	return nil
}
