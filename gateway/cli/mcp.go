package cli

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/IniZio/nexus/gateway/mcp"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/logging"
	"github.com/IniZio/nexus/pkg/settings"
	"github.com/IniZio/nexus/pkg/version"
)

func mcpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve the nexus MCP tools over stdio (claude mcp add --transport stdio nexus -- nexus mcp)",
		Long: "Serve the nexus MCP tools over stdio. Stdout carries only the protocol; logs go to stderr\n" +
			"(warn and above unless --log-level says otherwise). The bus is dialled on the first tool call,\n" +
			"so the server starts even before `nexus up`.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if jsonOutput(cmd) {
				return usageError{errors.New("mcp speaks the MCP protocol (JSON-RPC) on stdout: it has no --json output")}
			}
			level, _ := cmd.Flags().GetString("log-level")
			if !cmd.Flags().Changed("log-level") {
				level = "warn"
			}
			format, _ := cmd.Flags().GetString("log-format")
			log, err := logging.New(os.Stderr, level, format)
			if err != nil {
				return err
			}
			v, err := settings.Load(cmd.Flags())
			if err != nil {
				return StartupError(err)
			}
			g := &Global{Home: v.Home, Log: log, Settings: v}
			srv, err := mcp.New(mcp.Config{
				Version: version.Version,
				Log:     log,
				Dial: func(ctx context.Context) (*nats.Conn, error) {
					return bus.Connect(ctx, g.Bus(bus.UserCLI))
				},
			})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return srv.Serve(ctx, os.Stdin, os.Stdout)
		},
	}
}
