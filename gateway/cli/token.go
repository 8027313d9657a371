package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/IniZio/nexus/gateway/httpapi"
)

// tokenCommand is `nexus token`: the HTTP API's tokens, kept hashed under $NEXUS_HOME/api.
func tokenCommand() *cobra.Command {
	tok := &cobra.Command{Use: "token", Short: "Manage the HTTP API's tokens (nexus serve api, nexus up --api)"}
	open := func(cmd *cobra.Command) (*httpapi.Tokens, error) {
		g, err := Globals(cmd)
		if err != nil {
			return nil, err
		}
		return httpapi.OpenTokens(g.Home, g.Log)
	}
	var scope string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a token and print it once (it is stored only hashed)",
		Long: `Create an API token and print its secret once: it is stored only as a hash.
Scopes: read (list, get, logs, ports, egress, audit, files out of a guest), write (also create,
lifecycle, exec, files into a guest, snapshots, forks, images) and admin (also what reaches the
host's own files or secrets: --mount host paths, secret bindings and the secret store, worktree
delegation, agents that live-mount host credentials such as claude-code).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, err := httpapi.ParseScope(scope)
			if err != nil {
				return usageError{err}
			}
			ts, err := open(cmd)
			if err != nil {
				return err
			}
			secret, t, err := ts.Create(args[0], sc)
			if err != nil {
				return err
			}
			if printedJSON(cmd, map[string]any{"name": t.Name, "scope": t.Scope, "created_at": t.CreatedAt, "token": secret}) {
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout(), secret)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s (scope %s) created: it is shown only now; send it as Authorization: Bearer <token>\n", t.Name, t.Scope)
			return nil
		},
	}
	create.Flags().StringVar(&scope, "scope", string(httpapi.ScopeRead), "read, write or admin")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the tokens (names and scopes, never secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := open(cmd)
			if err != nil {
				return err
			}
			l, err := ts.List()
			if err != nil {
				return err
			}
			type row struct {
				Name      string        `json:"name"`
				Scope     httpapi.Scope `json:"scope"`
				CreatedAt string        `json:"created_at"`
			}
			rows := []row{}
			for _, t := range l {
				rows = append(rows, row{t.Name, t.Scope, t.CreatedAt.Format("2006-01-02T15:04:05Z07:00")})
			}
			if printedJSON(cmd, rows) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSCOPE\tCREATED")
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Name, r.Scope, r.CreatedAt)
			}
			return tw.Flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a token: requests with it are refused from the next one on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ts, err := open(cmd)
			if err != nil {
				return err
			}
			if err := ts.Revoke(args[0]); err != nil {
				return err
			}
			if !printedJSON(cmd, map[string]any{"name": args[0], "revoked": true}) {
				fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked\n", args[0])
			}
			return nil
		},
	}
	tok.AddCommand(create, ls, revoke)
	return tok
}
