package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// whoami names the operator in audit events: the OS user running the CLI.
func whoami() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return fmt.Sprintf("uid %d", os.Getuid())
}

// egressLiveCommands are `nexus egress allow|revoke|deny|apply`: changes of a sandbox's policy
// that a running sandbox takes within a second.
func egressLiveCommands() []*cobra.Command {
	change := func(use, short string, withFor bool, ep bus.Endpoint[api.EgressChangeRequest, api.EgressChange]) *cobra.Command {
		var d time.Duration
		cmd := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, _, err := dial(cmd)
				if err != nil {
					return err
				}
				ch, err := ep.Call(cmd.Context(), c.Conn(), "", api.EgressChangeRequest{Name: args[0], Host: args[1], For: d, By: whoami(), Via: "cli"})
				if err != nil {
					return err
				}
				if printedJSON(cmd, ch) {
					return nil
				}
				printChange(cmd.OutOrStdout(), ch)
				return nil
			},
		}
		if withFor {
			cmd.Flags().DurationVar(&d, "for", 0, "end it on its own after this long (e.g. 30m); without it, until revoked")
		}
		return cmd
	}
	allow := change("allow NAME HOST[:PORT,...]", "Allow a host on a sandbox, running or not (bare host: ports 443 and 80)", true, api.EgressAllow)
	revoke := change("revoke NAME HOST", "Remove a grant or a deny made with allow or deny; open connections it no longer allows are closed", false, api.EgressRevoke)
	deny := change("deny NAME HOST", "Refuse a host (or *.domain) on every port, over every allow including the agent profile's", true, api.EgressDeny)
	var configPath string
	var dry bool
	apply := &cobra.Command{
		Use:   "apply NAME",
		Short: "Read .nexus/config.yaml again, print the difference in the sandbox's allowlist, and apply it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.ForCreate(configPath)
			if err != nil {
				return err
			}
			if cfg == nil {
				wd, _ := os.Getwd()
				return errdefs.NotFound("egress apply: no %s at the git root of %s (give --config FILE)", config.RelPath, wd)
			}
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			ch, err := c.EgressApply(cmd.Context(), api.EgressApplyRequest{Name: args[0], Config: cfg, By: whoami(), Via: "cli", DryRun: dry})
			if err != nil {
				return err
			}
			if printedJSON(cmd, ch) {
				return nil
			}
			if dry {
				fmt.Fprintf(cmd.OutOrStdout(), "dry run: nothing applied to %s\n", ch.Sandbox)
			}
			printChange(cmd.OutOrStdout(), ch)
			return nil
		},
	}
	apply.Flags().StringVar(&configPath, "config", "", "the config file (default: .nexus/config.yaml at the git root of the working directory)")
	apply.Flags().BoolVar(&dry, "dry-run", false, "print the difference only")
	return []*cobra.Command{allow, revoke, deny, apply}
}

// printChange shows a live change as a diff of the effective policy.
func printChange(w io.Writer, ch api.EgressChange) {
	for _, a := range ch.Added {
		fmt.Fprintf(w, "+ %s\n", a)
	}
	for _, r := range ch.Removed {
		fmt.Fprintf(w, "- %s\n", r)
	}
	if len(ch.Added)+len(ch.Removed) == 0 {
		fmt.Fprintln(w, "no change to the effective allowlist")
	}
	switch {
	case ch.Live:
		fmt.Fprintf(w, "%s: applied to the running sandbox\n", ch.Sandbox)
	default:
		fmt.Fprintf(w, "%s: recorded; it applies when the sandbox starts\n", ch.Sandbox)
	}
	if g := ch.Grant; g != nil && !g.Until.IsZero() {
		fmt.Fprintf(w, "until %s (in %s)\n", g.Until.Local().Format(time.RFC3339), time.Until(g.Until).Round(time.Second))
	}
}

// printGrants lists a sandbox's live grants and denies in `egress show`.
func printGrants(w io.Writer, label string, gs []api.Grant) {
	for _, g := range gs {
		until := "until revoked"
		if !g.Until.IsZero() {
			until = "until " + g.Until.Local().Format(time.RFC3339)
			if time.Now().After(g.Until) {
				until += " (expired)"
			}
		}
		fmt.Fprintf(w, "%-9s %s  by %s at %s, %s\n", label+":", g.Rule, dash(g.By), g.At.Local().Format(time.RFC3339), until)
		label = strings.Repeat(" ", len(label))
	}
}

// egressAskCommands are `nexus egress requests|approve|reject`: the pending requests of
// ask-mode sandboxes (--egress-ask) and a person's answer to them.
func egressAskCommands() []*cobra.Command {
	var follow bool
	requests := &cobra.Command{
		Use:   "requests",
		Short: "List the pending egress requests of ask-mode sandboxes (-f: keep printing new ones)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			seen := map[string]int{}
			header := false
			for {
				list, err := c.EgressRequests(cmd.Context())
				if err != nil {
					return err
				}
				if !follow && printedJSON(cmd, list) {
					return nil
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				if !header && !jsonOutput(cmd) {
					fmt.Fprintln(w, "GUEST PROCESS and GUEST REASON are reported by the guest, not verified")
					fmt.Fprintln(tw, "ID\tSANDBOX\tHOST\tPORT\tFIRST SEEN\tCOUNT\tGUEST PROCESS\tGUEST REASON")
					header = true
				}
				for _, r := range list {
					if seen[r.ID] == r.Count {
						continue
					}
					seen[r.ID] = r.Count
					if jsonOutput(cmd) {
						b, _ := json.Marshal(r)
						fmt.Fprintln(w, string(b))
						continue
					}
					port := "any"
					if r.Port != 0 {
						port = fmt.Sprint(r.Port)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, r.Sandbox, r.Host, port, r.First.Local().Format("15:04:05"), r.Count, dash(r.Cmdline), dash(r.Reason))
				}
				tw.Flush()
				if !follow {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(time.Second):
				}
			}
		},
	}
	requests.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new requests")
	var d time.Duration
	var ports []int
	approve := &cobra.Command{
		Use:   "approve ID",
		Short: "Grant a pending request's host (its port, --port, or 443 and 80); a held query then proceeds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			ch, err := c.EgressApprove(cmd.Context(), api.EgressAnswerRequest{ID: args[0], For: d, Ports: ports, By: whoami(), Via: "cli"})
			if err != nil {
				return err
			}
			if !printedJSON(cmd, ch) {
				printChange(cmd.OutOrStdout(), ch)
			}
			return nil
		},
	}
	approve.Flags().DurationVar(&d, "for", 0, "end the grant on its own after this long (e.g. 30m)")
	approve.Flags().IntSliceVar(&ports, "port", nil, "ports to allow (repeatable or p1,p2; default the request's, or 443 and 80)")
	reject := &cobra.Command{
		Use:   "reject ID",
		Short: "Drop a pending request; the guest's held query fails as it would have",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			ch, err := c.EgressReject(cmd.Context(), api.EgressAnswerRequest{ID: args[0], By: whoami(), Via: "cli"})
			if err != nil {
				return err
			}
			if !printedJSON(cmd, ch) {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: request %s rejected\n", ch.Sandbox, args[0])
			}
			return nil
		},
	}
	return []*cobra.Command{requests, approve, reject}
}
