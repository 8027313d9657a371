package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
)

func configCommand() *cobra.Command {
	cfg := &cobra.Command{Use: "config", Short: "Check a project's .nexus/config.yaml"}
	check := &cobra.Command{
		Use:   "check [PATH]",
		Short: "Validate .nexus/config.yaml (default: at the git root of the working directory) and print the effective policy",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := ""
			if len(args) == 1 {
				path = args[0]
			} else {
				wd, err := os.Getwd()
				if err != nil {
					return err
				}
				if path, err = config.Find(wd); err != nil {
					return err
				}
				if path == "" {
					return errdefs.NotFound("nexus config: no %s at the git root of %s (give a PATH)", config.RelPath, wd)
				}
			}
			c, err := config.Load(path)
			if err != nil {
				return err
			}
			if printedJSON(cmd, c) {
				return nil
			}
			printEffective(cmd.OutOrStdout(), c)
			return nil
		},
	}
	cfg.AddCommand(check)
	return cfg
}

// printEffective renders what a sandbox created under c may reach, and how.
func printEffective(w io.Writer, c *config.Config) {
	fmt.Fprintf(w, "%s: valid (version %d)\n", c.Source, c.Version)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nHOST\tACCESS\tRULES")
	for _, a := range c.Egress.Allow {
		fmt.Fprintf(tw, "%s\topen\tevery request (egress.allow)\n", a)
	}
	for _, h := range c.Egress.Policy {
		var rules []string
		if len(h.Repos) > 0 {
			rules = append(rules, "repos "+strings.Join(h.Repos, ", "))
		}
		rules = append(rules, h.Paths...)
		switch h.Host {
		case httppolicy.GitHubWeb:
			rules = append(rules, "git smart-HTTP of bound repos (pushes to "+strings.Join(httppolicy.DefaultBranches, ", ")+")",
				"GET/HEAD archive and release downloads of any repo, credential stripped")
		case httppolicy.GitHubAPI:
			rules = append(rules, "GET /", "POST /graphql viewer { login } only (all other GraphQL refused)")
			if len(h.Repos) > 0 {
				rules = append(rules, "GET/HEAD /repos/<bound>/**, /user, /rate_limit, /meta",
					"POST /repos/<bound>/pulls, PATCH …/pulls/N, POST …/pulls/N/comments, …/issues/N/comments",
					"GET/HEAD /repos/<other>/**, credential stripped")
			}
		case httppolicy.GitHubUploads:
			if len(h.Repos) > 0 {
				rules = append(rules, "POST /repos/<bound>/releases/<id>/assets")
			}
		}
		for i, r := range rules {
			host, access := h.Host, "policy"
			if i > 0 {
				host, access = "", ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", host, access, r)
		}
		fmt.Fprintf(tw, "\t\teverything else refused (default-deny)\n")
	}
	tw.Flush()
	if len(c.Egress.Secrets) > 0 {
		fmt.Fprintln(w, "\nSECRETS (placeholders in the guest, swapped by the mitm on these hosts only)")
		for _, s := range c.Egress.Secrets {
			env := ""
			if s.Env != "" {
				env = " as $" + s.Env
			}
			if s.Header != "" {
				env += " in header " + s.Header
			}
			fmt.Fprintf(w, "  %s → %s%s\n", s.Name, strings.Join(s.Hosts, ", "), env)
		}
	}
}

func explainCommand() *cobra.Command {
	var data string
	cmd := &cobra.Command{
		Use:   "explain NAME METHOD URL",
		Short: "Print what the perimeter would decide for a request from a sandbox, and the rule that decides it, without sending it",
		Long: `Print what the perimeter would decide for a request from a sandbox, and the rule that
decides it, without sending it. Exits 0 on ALLOW and 1 on DENY (2 on bad input), so scripts
can test a decision by the status alone.`,
		Example: `  nexus egress explain demo/t1 GET https://api.github.com/repos/acme/app
  nexus egress explain demo/t1 POST https://api.github.com/graphql -d @query.json`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := data
			if f, ok := strings.CutPrefix(data, "@"); ok {
				b, err := os.ReadFile(f)
				if err != nil {
					return usageError{fmt.Errorf("egress explain: --data: %w", err)}
				}
				body = string(b)
			}
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			ex, err := c.EgressExplain(cmd.Context(), api.ExplainRequest{Name: args[0], Method: args[1], URL: args[2], Body: body})
			if err != nil {
				return err
			}
			if !printedJSON(cmd, ex) {
				w := cmd.OutOrStdout()
				fmt.Fprintf(w, "%s %s %s\n", strings.ToUpper(ex.Decision), ex.Method, ex.URL)
				fmt.Fprintf(w, "  layer:      %s\n  rule:       %s\n  reason:     %s\n", ex.Layer, ex.Rule, ex.Reason)
				if ex.Credential != "" {
					fmt.Fprintf(w, "  credential: %s\n", ex.Credential)
				}
			}
			if ex.Decision == audit.Deny {
				return ExitError{Code: 1} // as grep: scripts test the decision by the status
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&data, "data", "d", "", "request body, or @FILE (a GraphQL JSON body, a push's pkt-lines)")
	return cmd
}
