package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/choria-io/fisk"
	natscli "github.com/nats-io/natscli/cli"
	"github.com/nats-io/natscli/options"
	"github.com/spf13/cobra"

	"github.com/IniZio/nexus/pkg/bus"
)

// natsCommand is the NATS CLI (github.com/nats-io/natscli, the version go.mod pins) built in,
// already pointed at this stack's bus and logged in as admin: `nexus nats micro ls` works where
// `nats micro ls` would dial port 4222 with no user. The password never appears in argv.
func natsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "nats [COMMAND] [ARGS...]",
		Short: "The NATS CLI against this stack's bus, as admin (micro ls, stream ls, kv get, sub, …)",
		Long: "Run the NATS CLI against the bus of this home ($NEXUS_HOME, $NEXUS_BUS_PORT), logged in as the\n" +
			"admin bus user. Every argument is the NATS CLI's; nexus's own flags are read from the\n" +
			"environment only. For scripts, prefer commands that need no terminal: `stream get`, `sub --raw`,\n" +
			"`kv get --raw` (`stream view` pages on a terminal).",
		Example: "  nexus nats micro ls\n" +
			"  nexus nats stream ls\n" +
			"  nexus nats kv get nexus_sandboxes myproject/task-42 --raw\n" +
			"  nexus nats stream get NEXUS_AUDIT 1\n" +
			"  nexus nats sub 'nexus.audit.>' --stream NEXUS_AUDIT --all --raw --count 10",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
				return cmd.Help()
			}
			args, err := natsOwnFlags(cmd, args)
			if err != nil {
				return usageError{err}
			}
			if jsonOutput(cmd) {
				return usageError{errors.New("nats passes its arguments to the NATS CLI: put --json after the NATS command, e.g. nexus nats stream ls --json")}
			}
			g, err := Globals(cmd)
			if err != nil {
				return usageError{err}
			}
			creds, err := bus.LoadCreds(g.Home.BusCreds(), bus.UserAdmin)
			if err != nil && !natsHelp(args) {
				return fmt.Errorf("no admin credentials under %s: start the stack first with `nexus up`", g.Home.BusCreds())
			}
			url := g.Settings.BusURL
			if url == "" {
				url, _ = bus.ReadURL(g.Home, g.Settings.BusPort)
			}
			app := fisk.New("nexus nats", "The NATS CLI against this nexus stack's bus, as admin.")
			app.UsageWriter(cmd.OutOrStdout())
			app.ErrorWriter(cmd.ErrOrStderr())
			app.HelpFlag.Short('h')
			app.Terminate(func(code int) { panic(natsExit{code}) })
			natscli.SkipContexts = true // a nats context of the user's must not redirect it
			// A cluster node's bus speaks TLS only, on loopback too: trust its cluster's CA
			// (its client port asks for no client certificate).
			opts := &options.Options{Servers: url, Username: creds.User, Password: creds.Password,
				TlsCA: bus.CAFile(g.Home), Timeout: 5 * time.Second, ConnectionName: "nexus nats"}
			if !natsHelp(args) {
				// Our own connection (nexus's credentials, CA and inbox): the NATS CLI's own one
				// exits with status 1 a second after it is closed, which a loaded machine turns
				// into a failed command that had succeeded.
				ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
				nc, err := bus.Connect(ctx, bus.ConnectConfig{Home: g.Home, User: bus.UserAdmin, URL: url, Name: "nexus nats"})
				cancel()
				if err != nil {
					return err
				}
				defer nc.Close()
				opts.Conn = nc
			}
			if _, err := natscli.ConfigureInApp(app, opts, true); err != nil {
				return err
			}
			return runNats(app, args)
		},
	}
}

// natsOwnFlags takes nexus's own flags (--home, --bus-url, --json, …) from the front of args,
// up to the NATS command; the rest is the NATS CLI's.
func natsOwnFlags(cmd *cobra.Command, args []string) ([]string, error) {
	for len(args) > 0 && strings.HasPrefix(args[0], "--") && args[0] != "--" {
		name, value, hasValue := strings.Cut(strings.TrimPrefix(args[0], "--"), "=")
		f := cmd.Flags().Lookup(name)
		if f == nil {
			f = cmd.InheritedFlags().Lookup(name)
		}
		if f == nil {
			break // a flag of the NATS CLI's
		}
		args = args[1:]
		if !hasValue {
			if f.Value.Type() == "bool" {
				value = "true"
			} else if len(args) > 0 {
				value, args = args[0], args[1:]
			} else {
				return nil, fmt.Errorf("flag --%s needs a value", name)
			}
		}
		if err := cmd.Flags().Set(name, value); err != nil {
			if err := cmd.InheritedFlags().Set(name, value); err != nil {
				return nil, fmt.Errorf("--%s: %v", name, err)
			}
		}
	}
	return args, nil
}

// natsHelp reports whether args only ask the NATS CLI for help, which needs no stack.
func natsHelp(args []string) bool {
	if len(args) == 0 {
		return true
	}
	return slices.ContainsFunc(args, func(a string) bool { return a == "--help" || a == "-h" || a == "help" || a == "--help-long" })
}

// natsExit carries the NATS CLI's exit code out of its parser, which would call os.Exit.
type natsExit struct{ code int }

func runNats(app *fisk.Application, args []string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(natsExit)
			if !ok {
				panic(r)
			}
			if e.code != 0 {
				err = ExitError{Code: e.code}
			}
		}
	}()
	if _, err := app.Parse(args); err != nil {
		fmt.Fprintf(os.Stderr, "nexus nats: %v (nexus nats --help lists the commands)\n", err)
		return ExitError{Code: 2}
	}
	return nil
}
