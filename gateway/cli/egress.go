package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/audit"
)

// MaxSecretBytes bounds a secret value read from stdin or a file.
const MaxSecretBytes = 64 << 10

func secretCommand() *cobra.Command {
	sec := &cobra.Command{Use: "secret", Short: "Store credentials that sandboxes get only as placeholders"}
	var fromEnv, fromFile, command string
	var hosts []string
	set := &cobra.Command{
		Use:   "set NAME",
		Short: "Store a secret (value from stdin, --from-env, --from-file, or --command run on the host at use)",
		Long: `Store a secret. Sandboxes never see its value: they get a placeholder, which the
perimeter swaps for the value only in requests to the secret's hosts.

The value comes from stdin (on a terminal you are prompted and nothing is echoed),
--from-env, --from-file, or --command, run on the host each time the value is needed.`,
		Example: `  nexus secret set GITHUB_TOKEN --host api.github.com,github.com     # prompts
  gh auth token | nexus secret set GITHUB_TOKEN --host api.github.com
  nexus secret set OPENAI_API_KEY --from-env OPENAI_API_KEY --host api.openai.com
  nexus secret set GH --command 'gh auth token' --host api.github.com`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := credapi.SecretSetRequest{Name: args[0], Hosts: hosts}
			sources := 0
			for _, s := range []string{fromEnv, fromFile, command} {
				if s != "" {
					sources++
				}
			}
			if sources > 1 {
				return usageError{errors.New("secret set: give at most one of --from-env, --from-file, --command")}
			}
			switch {
			case command != "":
				req.Command = command
			case fromEnv != "":
				v, ok := os.LookupEnv(fromEnv)
				if !ok || v == "" {
					return usageError{fmt.Errorf("secret set: $%s is not set", fromEnv)}
				}
				req.Value = v
			default:
				var r io.Reader = cmd.InOrStdin()
				if f, ok := r.(*os.File); ok && fromFile == "" && term.IsTerminal(int(f.Fd())) {
					// A person at a terminal: prompt, and do not echo what they type.
					fmt.Fprintf(cmd.ErrOrStderr(), "Value of secret %s (not echoed): ", args[0])
					b, err := term.ReadPassword(int(f.Fd()))
					fmt.Fprintln(cmd.ErrOrStderr())
					if err != nil {
						return fmt.Errorf("secret set: %w", err)
					}
					r = bytes.NewReader(b)
				}
				if fromFile != "" {
					f, err := os.Open(fromFile)
					if err != nil {
						return fmt.Errorf("secret set: %w", err)
					}
					defer f.Close()
					r = f
				}
				b, err := io.ReadAll(io.LimitReader(r, MaxSecretBytes+1))
				if err != nil {
					return fmt.Errorf("secret set: %w", err)
				}
				if len(b) > MaxSecretBytes {
					return usageError{fmt.Errorf("secret set: the value is longer than %d bytes", MaxSecretBytes)}
				}
				req.Value = strings.TrimRight(string(b), "\r\n")
				if req.Value == "" {
					return usageError{errors.New("secret set: the value is empty (pipe it on stdin, or use --from-env, --from-file or --command)")}
				}
			}
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			if err := c.SecretSet(cmd.Context(), req); err != nil {
				return err
			}
			done(cmd, args[0], "stored", "secret %s stored; sandboxes created from now on get a placeholder of it\n", args[0])
			return nil
		},
	}
	set.Flags().StringVar(&fromEnv, "from-env", "", "read the value from this environment variable")
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file")
	set.Flags().StringVar(&command, "command", "", "run this on the host each time the value is needed (e.g. 'gh auth token')")
	set.Flags().StringSliceVar(&hosts, "host", nil, "the only hosts the secret may be sent to: h1,h2 or repeated; *.example.com allowed (without it only `nexus create --secret NAME@host` can bind it)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List secrets (names, hosts, updated; never values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			list, err := c.SecretList(cmd.Context())
			if err != nil {
				return err
			}
			if printedJSON(cmd, list.Secrets) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSOURCE\tHOSTS\tUPDATED")
			for _, s := range list.Secrets {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, s.Source, dash(strings.Join(s.Hosts, ",")), age(s.Updated)+" ago")
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a secret",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			if err := c.SecretRemove(cmd.Context(), args[0]); err != nil {
				return err
			}
			done(cmd, args[0], "removed", "secret %s removed\n", args[0])
			return nil
		},
	}
	sec.AddCommand(set, ls, rm)
	return sec
}

func auditCommand() *cobra.Command {
	au := &cobra.Command{Use: "audit", Short: "Read the egress audit stream"}
	var follow, denied, apiReqs bool
	var sandboxes, apiTokens []string
	var since time.Duration
	tail := &cobra.Command{
		Use:   "tail",
		Short: "Print egress decisions (every DNS, L4, TLS, HTTP and credential decision)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			names := map[string]string{}
			if all, err := c.List(cmd.Context(), api.ListRequest{All: true}); err == nil {
				for _, s := range all {
					names[s.ID] = s.Name
				}
			}
			opts := audit.TailOptions{Denied: denied, Follow: follow, API: apiReqs || len(apiTokens) > 0, Tokens: apiTokens}
			if opts.API && len(sandboxes) > 0 {
				return usageError{errors.New("--sandbox selects egress decisions; API requests are selected with --token")}
			}
			for _, n := range sandboxes {
				sb, err := c.Get(cmd.Context(), n)
				if err != nil {
					return err
				}
				opts.Sandboxes = append(opts.Sandboxes, sb.ID)
			}
			if since > 0 {
				opts.Since = time.Now().Add(-since)
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			if follow {
				sig := signalCtx(ctx)
				ctx = sig
			}
			w := cmd.OutOrStdout()
			enc := json.NewEncoder(w)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			asJSON := jsonOutput(cmd) // one event per line
			switch {
			case asJSON:
			case opts.API:
				fmt.Fprintln(tw, "TIME\tTOKEN\tDECISION\tREQUEST\tSTATUS\tROUTE\tCLIENT")
			default:
				fmt.Fprintln(tw, "TIME\tSANDBOX\tLAYER\tDECISION\tDESTINATION\tREQUEST\tRULE\tREASON")
			}
			err = audit.Tail(ctx, c.Conn(), opts, func(ev audit.Event) error {
				if asJSON {
					return enc.Encode(ev)
				}
				if opts.API {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s %s\t%d\t%s\t%s\n", ev.Time.Local().Format("15:04:05.000"), dash(ev.Token), ev.Decision,
						ev.Method, ev.Path, ev.Status, dash(ev.Rule), dash(ev.IP))
					if follow {
						tw.Flush()
					}
					return nil
				}
				name := names[ev.Sandbox]
				if name == "" {
					name = ev.Sandbox
				}
				dest := ev.Host
				if dest == "" {
					dest = ev.IP
				}
				if ev.Port != 0 {
					dest = fmt.Sprintf("%s:%d", dest, ev.Port)
				}
				req := strings.TrimSpace(ev.Method + " " + ev.Path)
				if ev.Status != 0 {
					req += fmt.Sprintf(" → %d", ev.Status)
				}
				if ev.Swapped {
					req += " (credential swapped)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ev.Time.Local().Format("15:04:05.000"), name, ev.Layer, ev.Decision,
					dash(dest), dash(req), dash(ev.Rule), ev.Reason)
				if follow {
					tw.Flush()
				}
				return nil
			})
			tw.Flush()
			return err
		},
	}
	tail.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new decisions")
	tail.Flags().BoolVar(&denied, "denied", false, "only denials")
	tail.Flags().StringArrayVar(&sandboxes, "sandbox", nil, "only this sandbox (repeatable)")
	tail.Flags().DurationVar(&since, "since", 0, "only decisions newer than this (e.g. 10m)")
	tail.Flags().BoolVar(&apiReqs, "api", false, "the remote API's requests (who called it with which token) instead of egress decisions")
	tail.Flags().StringArrayVar(&apiTokens, "token", nil, "only the API requests made with this token (repeatable; implies --api)")
	au.AddCommand(tail)
	return au
}

func egressCommand() *cobra.Command {
	eg := &cobra.Command{Use: "egress", Short: "Inspect and change a sandbox's egress perimeter"}
	show := &cobra.Command{
		Use:   "show NAME",
		Short: "Print the effective allowlist, mode, expiry and the DNS table",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			v, err := c.EgressShow(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if printedJSON(cmd, v) {
				return nil
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "sandbox:  %s\nmode:     %s\n", v.Sandbox, v.Egress.Mode)
			if !v.Egress.AllowAllUntil.IsZero() {
				state := "active"
				if time.Now().After(v.Egress.AllowAllUntil) {
					state = "expired: default-deny"
				}
				fmt.Fprintf(w, "until:    %s (%s)\n", v.Egress.AllowAllUntil.Local().Format(time.RFC3339), state)
			}
			fmt.Fprintf(w, "allow:    %s\n", dash(strings.Join(v.Egress.Allow, " ")))
			printGrants(w, "granted", v.Egress.Grants)
			printGrants(w, "denied", v.Egress.Denies)
			if v.Egress.Ask {
				fmt.Fprintf(w, "ask:      on: hosts off the list are held as requests (%d pending; nexus egress requests)\n", len(v.Egress.Requests))
			}
			if len(v.Egress.Repos) > 0 {
				fmt.Fprintf(w, "repos:    %s\n", strings.Join(v.Egress.Repos, " "))
			}
			if len(v.Egress.AllowPrivate) > 0 {
				fmt.Fprintf(w, "private:  %s (other private addresses are refused)\n", strings.Join(v.Egress.AllowPrivate, " "))
			}
			if len(v.Secrets) > 0 {
				fmt.Fprintf(w, "secrets:  %s (placeholders in the guest; swapped by the mitm)\n", strings.Join(v.Secrets, " "))
			}
			if l := v.AuditLimited; l != nil {
				fmt.Fprintf(w, "audit:    limited: over its audit rate, %d events recorded only as counts (last %s); see nexus audit tail --sandbox %s\n",
					l.Suppressed, l.Last.Local().Format("15:04:05"), v.Sandbox)
			}
			if v.Network == nil {
				fmt.Fprintln(w, "network:  none (no packet leaves)")
				return nil
			}
			fmt.Fprintf(w, "network:  %s (guest %s, gateway/dns %s), %d allowed, %d denied\n", v.Network.EffectiveMode, v.Network.GuestIP, v.Network.GatewayIP,
				v.Network.Counters.Allowed, v.Network.Counters.Denied)
			if l := v.Network.Limits; l.MaxConns > 0 {
				fmt.Fprintf(w, "limits:   %d connections, %d new/s, %d dns/s, %d KiB/s out, %d KiB/s in; %d open, %d held back\n", l.MaxConns, l.ConnRate, l.DNSRate,
					l.EgressBandwidth>>10, l.IngressBandwidth>>10, v.Network.Counters.Flows, v.Network.Counters.Limited)
			}
			if len(v.Network.DNS) > 0 {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "\nNAME\tADDRESSES\tTTL\tEXPIRES")
				for _, d := range v.Network.DNS {
					fmt.Fprintf(tw, "%s\t%s\t%ds\t%s\n", d.Name, strings.Join(d.IPs, ","), d.TTL, d.Expires.Local().Format("15:04:05"))
				}
				tw.Flush()
			}
			return nil
		},
	}
	eg.AddCommand(show, explainCommand())
	eg.AddCommand(egressLiveCommands()...)
	eg.AddCommand(egressAskCommands()...)
	return eg
}
