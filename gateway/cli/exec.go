package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

func execCommand() *cobra.Command {
	var interactive, tty bool
	var env []string
	var dir, timeout string
	cmd := &cobra.Command{
		Use:   "exec [flags] NAME CMD [ARGS…]",
		Short: "Run a command in a sandbox; its exit status is nexus's",
		Long: `Run a command in a sandbox. Flags after NAME belong to the command, as with docker exec
(` + "`nexus exec box ls -la`" + `); a -- after NAME is allowed, and nexus flags between NAME and
that -- are still nexus's.

nexus exits with the command's own status (124 after --timeout), or with 125 when nexus
itself failed (as docker run does): a bad flag, a sandbox that is missing or not running,
a stack that is down, a stream lost on the way. A command whose caller's stream is lost is
killed, so a caller that retries after 125 never runs it twice.

With --json the command's output is captured and printed as one object
{exit_code, stdout, stderr, stdout_bytes, stderr_bytes, signal, error} (as the MCP tool
sandbox_exec returns it); the exit status stays the command's. -t refuses --json.`,
		Example: `  nexus exec demo/t1 ls -la /workspace
  nexus exec -it demo/t1 bash
  nexus exec -e CI=1 -w /workspace demo/t1 -- make test
  nexus exec --json demo/t1 git status --short`,
		Args: execArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv, err := execArgv(cmd, args[1:])
			if err != nil {
				return execFailure{err}
			}
			if tty {
				if err := refuseJSON(cmd, "-t gives it a terminal"); err != nil {
					return execFailure{err}
				}
			}
			req := api.ExecRequest{Name: args[0], Argv: argv, Env: env, Dir: dir, TTY: tty, Stdin: interactive, Timeout: timeout}
			if jsonOutput(cmd) {
				return execJSON(cmd, req)
			}
			return execIn(cmd, req)
		},
	}
	cmd.SetFlagErrorFunc(execFlagError)
	f := cmd.Flags()
	f.SetInterspersed(false) // everything after NAME belongs to the command
	f.BoolVarP(&interactive, "interactive", "i", false, "forward stdin")
	f.BoolVarP(&tty, "tty", "t", false, "allocate a pty (stderr is merged into stdout)")
	f.StringArrayVarP(&env, "env", "e", nil, "set K=V in the command's environment (repeatable)")
	f.StringVarP(&dir, "workdir", "w", "", "working directory in the guest")
	f.StringVar(&timeout, "timeout", "", "kill the command after this long (e.g. 30s); exit status 124")
	return cmd
}

// execArgv is the command after NAME: everything, or, with a --, what follows it, the words
// between NAME and the -- being nexus flags (the older `nexus exec NAME -i -- CMD`).
func execArgv(cmd *cobra.Command, rest []string) ([]string, error) {
	dash := slices.Index(rest, "--")
	switch {
	case dash == 0:
		rest = rest[1:]
	case dash > 0 && strings.HasPrefix(rest[0], "-"):
		// Flags of exec between NAME and --: nexus's (the trial parse sets nothing); anything
		// else is a command with its own flags and a -- of its own.
		trial := execCommand().Flags()
		if err := trial.Parse(rest[:dash]); err != nil {
			return nil, usageError{err}
		}
		if len(trial.Args()) == 0 {
			if err := cmd.Flags().Parse(rest[:dash]); err != nil {
				return nil, usageError{err}
			}
			rest = rest[dash+1:]
		}
	}
	if len(rest) > 0 && rest[0] == "" {
		return nil, usageError{errors.New("exec: the command is missing: nexus exec NAME CMD [ARGS…]")}
	}
	// No command at all: the image's Entrypoint + Cmd, or the vmm says it has none.
	return rest, nil
}

// ExecResult is what `nexus exec --json` prints: the fields of the MCP tool sandbox_exec's
// result, with the whole output (nothing is cut on the command line).
type ExecResult struct {
	Sandbox     string `json:"sandbox"`
	ExitCode    int    `json:"exit_code"`
	Stdout      string `json:"stdout"`
	Stderr      string `json:"stderr"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	Signal      int    `json:"signal,omitempty"`
	// Error is why the command could not run (e.g. not found), as the guest agent said.
	Error string `json:"error,omitempty"`
}

// execJSON runs req with its output captured and prints it as ExecResult; it exits with the
// command's status, as without --json) or ExitExecFailed when nexus failed.
func execJSON(cmd *cobra.Command, req api.ExecRequest) error {
	if err := checkEnv(req.Env); err != nil {
		return execFailure{err}
	}
	c, _, err := dial(cmd)
	if err != nil {
		return execFailure{err}
	}
	var stdin io.Reader = strings.NewReader("")
	if req.Stdin {
		stdin = cmd.InOrStdin()
	}
	var out, errOut strings.Builder
	exit, err := c.Run(cmd.Context(), req, api.IO{Stdin: stdin, Stdout: &out, Stderr: &errOut})
	if err != nil {
		return execFailure{err}
	}
	name, _ := api.ParseName(req.Name)
	printJSON(cmd.OutOrStdout(), ExecResult{Sandbox: name, ExitCode: exit.Code, Stdout: out.String(), Stderr: errOut.String(),
		StdoutBytes: int64(out.Len()), StderrBytes: int64(errOut.Len()), Signal: exit.Signal, Error: strings.TrimPrefix(exit.Error, "nexus: ")})
	return ExitError{Code: exit.Code}
}

func attachCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "attach NAME",
		Short:   "Open an interactive shell in a sandbox",
		Long:    "Open an interactive shell in a sandbox; nexus exits with the shell's status, or 125 when nexus itself failed.",
		Example: "  nexus attach demo/t1",
		Args:    execArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := refuseJSON(cmd, "it opens a shell on this terminal"); err != nil {
				return execFailure{err}
			}
			req := api.ExecRequest{Name: args[0], Argv: []string{"/bin/sh", "-c", "exec $(command -v bash || echo /bin/sh) -l"}, TTY: true, Stdin: true,
				Env: []string{"TERM=" + envOr("TERM", "xterm-256color")}}
			return execIn(cmd, req)
		},
	}
	cmd.SetFlagErrorFunc(execFlagError)
	return cmd
}

// execIn runs req for exec or attach: the guest command's status, or ExitExecFailed for any
// failure of nexus on the way.
func execIn(cmd *cobra.Command, req api.ExecRequest) error {
	c, _, err := dial(cmd)
	if err != nil {
		return execFailure{err}
	}
	code, err := runExec(cmd.Context(), c, req, os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr())
	if err != nil {
		return execFailure{err}
	}
	return ExitError{Code: code}
}

// execArgs and execFlagError make exec's and attach's usage errors exit ExitExecFailed too:
// status 2 could be the guest command's.
func execArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return execFailure{usageError{err}}
		}
		return nil
	}
}

func execFlagError(_ *cobra.Command, err error) error { return execFailure{usageError{err}} }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func checkEnv(env []string) error {
	for _, e := range env {
		if !strings.Contains(e, "=") {
			return usageError{fmt.Errorf("invalid -e %q: use KEY=VALUE", e)}
		}
	}
	return nil
}

// runExec runs req and relays its I/O; it returns the guest command's exit status.
func runExec(ctx context.Context, c *api.Client, req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := checkEnv(req.Env); err != nil {
		return 0, err
	}
	inFile, inIsFile := stdin.(*os.File)
	isTerm := inIsFile && term.IsTerminal(int(inFile.Fd()))
	if req.TTY && isTerm {
		if w, h, err := term.GetSize(int(inFile.Fd())); err == nil {
			req.Cols, req.Rows = uint16(w), uint16(h)
		}
	}
	pipes := api.IO{Stdin: stdin, Stdout: stdout, Stderr: stderr}
	if req.TTY && isTerm {
		old, err := term.MakeRaw(int(inFile.Fd()))
		if err == nil {
			defer term.Restore(int(inFile.Fd()), old)
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		resize := make(chan vmmapi.Resize, 1)
		pipes.Resize = resize
		go func() {
			for range winch {
				if w, h, err := term.GetSize(int(inFile.Fd())); err == nil {
					select {
					case resize <- vmmapi.Resize{Rows: uint16(h), Cols: uint16(w)}:
					default:
					}
				}
			}
		}()
	}
	exit, err := c.Run(ctx, req, pipes)
	if err != nil {
		return 0, err
	}
	if exit.Error != "" {
		fmt.Fprintf(stderr, "nexus: %s\n", strings.TrimPrefix(exit.Error, "nexus: "))
	}
	return exit.Code, nil
}

// guestPath splits NAME:/path; anything else is a host path.
func guestPath(s string) (name, path string, ok bool) {
	i := strings.Index(s, ":/")
	if i <= 0 || strings.ContainsRune(s[:i], '/') && strings.Count(s[:i], "/") > 1 {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}
