// Package cli is the nexus command line: thin cobra commands over the gateway's bus API
// (pkg/api/gateway), with human tables by default, --json everywhere and exit codes that
// scripts can rely on: 0 ok, 1 failure, 2 bad input or a stack that cannot start, and the
// guest command's own status for `nexus exec`, which exits 125 when nexus itself failed.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/pkg/logging"
	"github.com/IniZio/nexus/pkg/settings"
	"github.com/IniZio/nexus/pkg/stream"
	"github.com/IniZio/nexus/pkg/version"
)

// Global is what every command derives from the persistent flags and the environment.
type Global struct {
	Home home.Dir
	Log  zerolog.Logger
	// Settings holds the global settings (home, bus port and URL) and, for `nexus up` and
	// `nexus serve`, the stack settings too (pkg/settings).
	Settings *settings.Values
}

// Bus is how this command dials the bus as user.
func (g *Global) Bus(user string) bus.ConnectConfig {
	return bus.ConnectConfig{Home: g.Home, User: user, URL: g.Settings.BusURL, Port: g.Settings.BusPort, Log: g.Log,
		Watch: user == bus.UserCLI || user == bus.UserAPI} // a CLI or API call learns at once when the service it waits for is gone
}

// NewRoot builds the root command with every CLI command; main adds up and serve.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "nexus",
		Short:         "Run untrusted AI coding agents in per-task microVMs with a default-deny perimeter",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().String("log-format", "console", "log format: console or json")
	settings.AddFlags(root.PersistentFlags(), settings.Global)
	addJSONFlag(root)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		statusCommand(),
		// sandboxes
		createCommand(), psCommand(), statsCommand(), sandboxCommand(),
		execCommand(), attachCommand(), cpCommand(), logsCommand(), portsCommand(),
		snapshotCommand(), forkCommand(), volumeCommand(),
		// images, secrets and the perimeter
		imageCommand(), secretCommand(), auditCommand(), egressCommand(), configCommand(),
		// agents
		delegateCommand(), agentCommand(), herdrCommand(), mcpCommand(), tokenCommand(), natsCommand(),
		clusterCommand(), hostsCommand(),
		versionCommand(), downCommand(),
	)
	root.AddCommand(lifecycleCommands()...)
	addExamples(root)
	return root
}

// Globals resolves the persistent flags and the settings declared on cmd; bad values are
// exit-2 errors.
func Globals(cmd *cobra.Command) (*Global, error) {
	level, _ := cmd.Flags().GetString("log-level")
	format, _ := cmd.Flags().GetString("log-format")
	log, err := logging.New(os.Stderr, level, format)
	if err != nil {
		return nil, err
	}
	v, err := settings.Load(cmd.Flags())
	if err != nil {
		return nil, err
	}
	if v.StreamPeerGone > 0 {
		stream.SetPeerGone(v.StreamPeerGone)
	}
	return &Global{Home: v.Home, Log: log, Settings: v}, nil
}

// ExitError ends the process with Code after printing nothing more.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

type usageError struct{ error }

// ExitExecFailed is the status of `nexus exec` and `nexus attach` when nexus failed, not the
// guest command (as with `docker run`), so that it never passes for the command's own status.
const ExitExecFailed = vmmapi.ExitNexusFailed

// execFailure marks a failure of exec or attach themselves: exit ExitExecFailed.
type execFailure struct{ error }

func (e execFailure) Unwrap() error { return e.error }

type startupError struct{ error }

func (e startupError) Unwrap() error { return e.error }

// StartupError marks an error that kept the stack from starting: exit code 2.
func StartupError(err error) error { return startupError{err} }

// Execute runs root and returns the process exit code, printing one clear line on failure.
func Execute(root *cobra.Command) int {
	strictGroups(root)
	completion(root)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	var exit ExitError
	if errors.As(err, &exit) {
		return exit.Code
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "nexus") {
		msg = "nexus: " + msg
	}
	stderr := root.ErrOrStderr()
	asJSON := jsonAsked(cmd, os.Args[1:])
	if asJSON {
		json.NewEncoder(stderr).Encode(errorJSON(err, msg))
	} else {
		fmt.Fprintln(stderr, msg)
	}
	var ue usageError
	var se startupError
	var ef execFailure
	usage := errors.As(err, &ue) || isCobraUsage(err)
	if usage && !asJSON {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	switch {
	case errors.As(err, &ef):
		return ExitExecFailed
	case usage, errors.As(err, &se), errors.Is(err, errdefs.ErrInvalid):
		return 2
	}
	return 1
}

func isCobraUsage(err error) bool {
	m := err.Error()
	return strings.HasPrefix(m, "unknown command") || strings.HasPrefix(m, "accepts ") ||
		strings.HasPrefix(m, "requires at least") || strings.HasPrefix(m, "invalid argument")
}

// signalCtx ends when the user presses Ctrl-C (for commands that follow a stream).
func signalCtx(parent context.Context) context.Context {
	ctx, _ := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	return ctx
}

// strictGroups makes every command group (a command with subcommands and nothing to run of its
// own) refuse an unknown subcommand with exit 2, as the root does, instead of printing its help
// and exiting 0; a group run alone still prints its help.
func strictGroups(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c == root || !c.HasSubCommands() || c.Runnable() {
			return
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
			}
			return cmd.Help()
		}
	}
	walk(root)
}

// versionInfo is what `nexus version --json` prints.
type versionInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this nexus binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := versionInfo{Version: version.Version, Commit: version.Commit, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
			if !printedJSON(cmd, v) {
				fmt.Fprintf(cmd.OutOrStdout(), "nexus %s (commit %s, %s, %s/%s)\n", v.Version, v.Commit, v.Go, v.OS, v.Arch)
			}
			return nil
		},
	}
}
