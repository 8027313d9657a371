package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/stream"
)

// dial connects the CLI to the gateway.
func dial(cmd *cobra.Command) (*api.Client, *Global, error) {
	g, err := Globals(cmd)
	if err != nil {
		return nil, nil, err
	}
	nc, err := bus.Connect(cmd.Context(), g.Bus(bus.UserCLI))
	if err != nil {
		return nil, nil, err
	}
	cobra.OnFinalize(nc.Close)
	return api.NewClient(nc), g, nil
}

// sandboxCommand is `nexus sandbox`: aliases of the top-level sandbox commands.
func sandboxCommand() *cobra.Command {
	sandbox := &cobra.Command{Use: "sandbox", Short: "Sandbox commands (aliases of the top-level ones: create, ls, start, stop, pause, resume, rm)"}
	sandbox.AddCommand(createCommand(), psCommand())
	sandbox.AddCommand(lifecycleCommands()...)
	return sandbox
}

// lifecycleCommands are start, stop, pause, resume and rm: one verb on named or selected
// sandboxes.
func lifecycleCommands() []*cobra.Command {
	var cmds []*cobra.Command
	for _, v := range []struct {
		use   string
		verb  api.Lifecycle
		short string
	}{
		{"start", api.Start, "Start created or stopped sandboxes"},
		{"stop", api.Stop, "Stop running sandboxes (their disks are kept)"},
		{"pause", api.Pause, "Pause running sandboxes"},
		{"resume", api.Resume, "Resume paused sandboxes"},
		{"rm", api.Remove, "Remove sandboxes and everything they own"},
	} {
		cmds = append(cmds, applyCommand(v.use, v.verb, v.short))
	}
	return cmds
}

func createCommand() *cobra.Command {
	var r api.CreateRequest
	var labels, hostLabels []string
	var configPath string
	cmd := &cobra.Command{
		Use:   "create [project/]NAME",
		Short: "Create a sandbox and boot it; returns when its guest agent answers",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if r.Labels, err = api.ParseLabels(labels); err != nil {
				return err
			}
			if r.HostLabels, err = api.ParseLabels(hostLabels); err != nil {
				return err
			}
			if r.Config, err = config.ForCreate(configPath); err != nil {
				return err
			}
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			r.Name = args[0]
			r.UserSecrets = len(r.Secrets) > 0 // typed here: may bind a secret stored without hosts
			return booting(cmd, c, r.Host, api.CreateTimeout, func(ctx context.Context, progress string) (*api.Sandbox, error) {
				r.Progress = progress
				return c.Create(ctx, r)
			}, func(w io.Writer, sb *api.Sandbox, took time.Duration) {
				fmt.Fprintf(w, "%s %s in %.1fs (image %s, %d MiB, %d vCPU)\n", sb.Name, sb.State, took.Seconds(), sb.Image, sb.MemoryMiB, sb.VCPUs)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&r.Image, "image", "", "root image: "+api.DefaultImage+" (the default: Debian bookworm, with git) or nexus-mini (busybox, boots fastest); see nexus image ls")
	f.StringArrayVarP(&labels, "label", "l", nil, "label key=value (repeatable)")
	memoryFlag(f, &r.MemoryMiB)
	diskFlag(f, &r.DiskMiB)
	diskRateFlags(f, &r.DiskBps, &r.DiskIOPS)
	f.IntVar(&r.VCPUs, "vcpus", 0, "virtual CPUs (default 1)")
	f.Float64Var(&r.CPUs, "cpus", 0, "host CPU time the sandbox may use, in CPUs, fractional allowed (default: its vCPUs)")
	f.StringVar(&r.Agent, "agent", "", agentFlagHelp)
	f.StringVar(&r.EgressMode, "egress", "", "egress mode: curated, allow-all[=DURATION] or none")
	f.BoolVar(&r.EgressAsk, "egress-ask", false, "hold a connection to a host off the list as a pending request a person may approve (nexus egress requests)")
	f.StringArrayVar(&r.AllowHosts, "allow-host", nil, "allow HOST[:PORT] (repeatable; a bare host means 443 and 80)")
	f.StringArrayVar(&r.AllowPrivate, "allow-private", nil, "let allowed names reach this private network CIDR (RFC 1918, CGNAT, link-local, ULA; repeatable); other private addresses are refused")
	f.StringArrayVar(&r.Repos, "repo", nil, "bind a GitHub repo owner/repo (repeatable)")
	f.StringArrayVar(&r.Secrets, "secret", nil, "broker secret NAME@host[,host][:header=NAME], within the hosts it was stored for (repeatable)")
	f.StringArrayVar(&r.Mounts, "mount", nil, "share HOST:GUEST[:ro] over virtio-9p (repeatable)")
	f.StringArrayVar(&r.MountNamed, "mount-named", nil, fmt.Sprintf("named volume NAME:GUEST[,kind=disk][,size=SIZE]: a per-sandbox ext4 disk for write-heavy paths, sparse, size as in 2g (default %dg) (repeatable)", api.DefaultVolumeMiB>>10))
	f.BoolVar(&r.NoPortForward, "no-port-forward", false, "do not forward guest listeners to the host")
	f.StringVar(&r.Host, "host", "", "place the sandbox on this host of the cluster (nexus hosts; default: the one with the most free memory)")
	f.StringArrayVar(&hostLabels, "host-label", nil, "place the sandbox on a host with label key=value (repeatable)")
	f.BoolVar(&r.Cold, "cold", false, "boot the VM even when a booted template of the image and size exists (default: restore it, see nexus image warm)")
	f.StringVar(&r.TTL, "ttl", "", "remove the sandbox this long after create, whatever its state (30m, 2h, 7d; default: never)")
	f.StringVar(&r.IdleTimeout, "idle-timeout", "", "pause the sandbox after this long without exec, attach, copy, port-forward or network activity and under 5% CPU; the next exec resumes it (default: never)")
	limitFlags(f, &r.Limits)
	f.StringVar(&configPath, "config", "", "project config (default: .nexus/config.yaml at the git root of the working directory)")
	return cmd
}

// booting runs a request that boots a sandbox (create, fork, delegate create) under timeout:
// the boot steps are printed on stderr as they finish unless --json is given, then the result
// is printed as JSON or as human writes it.
// host, when known, is the host the sandbox boots on.
func booting[T any](cmd *cobra.Command, c *api.Client, host string, timeout time.Duration, call func(ctx context.Context, progress string) (T, error),
	human func(w io.Writer, v T, took time.Duration)) error {
	progress, stop := "", func() {}
	if !jsonOutput(cmd) {
		progress, stop = followSteps(c.Conn(), host, cmd.ErrOrStderr())
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	start := time.Now()
	v, err := call(ctx, progress)
	stop()
	if err != nil {
		return err
	}
	if !printedJSON(cmd, v) {
		human(cmd.OutOrStdout(), v, time.Since(start))
	}
	return nil
}

// followSteps prints boot steps as they arrive on a private stream session's .out on the
// sandbox's host: host when the caller names it (--host), else the first host heard; it
// returns the session id to ask with.
func followSteps(nc *nats.Conn, host string, w io.Writer) (string, func()) {
	id := stream.NewID()
	sub, err := stream.Follow(nc, host, id, func(data []byte) {
		var st vmmapi.Step
		if json.Unmarshal(data, &st) == nil && st.Name != "" {
			fmt.Fprintf(w, "  %-14s %6.2fs\n", st.Name, float64(st.Millis)/1000)
		}
	})
	if err != nil {
		return "", func() {}
	}
	return id, func() { nc.Flush(); sub.Unsubscribe() }
}

func psCommand() *cobra.Command {
	var all bool
	var sel []string
	cmd := &cobra.Command{
		Use:     "ps",
		Aliases: []string{"ls"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			req := api.ListRequest{Selector: sel, All: all}
			if jsonOutput(cmd) {
				// The gateway's JSON, indented: 10,000 sandboxes are not decoded to be encoded again.
				raw, err := c.ListJSON(cmd.Context(), req)
				if err != nil {
					return err
				}
				return printRawJSON(cmd.OutOrStdout(), raw)
			}
			list, err := api.ListInto(cmd.Context(), c, req, func(r *psRow) string { return r.Name })
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tIMAGE\tAGENT\tEGRESS\tMEMORY (RSS/LIMIT)\tLABELS\tAGE\tHOST")
			for _, s := range list {
				mem := fmt.Sprintf("-/%dMiB", s.MemoryMiB) // not running: no resident memory
				if s.RSSBytes > 0 {
					mem = fmt.Sprintf("%dMiB/%dMiB", s.RSSBytes>>20, s.MemoryMiB)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.State, s.Image, s.Agent, egressColumn(s.Egress)+auditLimitedMark(s.AuditLimited),
					mem, dash(api.FormatLabels(s.Labels)), ageColumn(api.Sandbox{CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt, IdleTimeout: s.IdleTimeout}), s.Host)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			// A sandbox whose QEMU is not fully contained says so (issue 19), beside the table.
			for _, s := range list {
				if s.Containment != "" && s.Containment != "contained" && !strings.HasPrefix(s.Containment, "contained;") {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s is %s\n", s.Name, s.Containment)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include stopped and failed sandboxes")
	cmd.Flags().StringArrayVarP(&sel, "selector", "l", nil, "label selector k=v, k!=v or k (in a value, \\ escapes , and \\)")
	return cmd
}

// psRow is what the ps table shows of a sandbox (api.SandboxView's fields of the same names):
// the rest of 10,000 records is not decoded for it.
type psRow struct {
	Name         string            `json:"name"`
	State        api.State         `json:"state"`
	Image        string            `json:"image"`
	Agent        string            `json:"agent"`
	Egress       api.Egress        `json:"egress"`
	MemoryMiB    int               `json:"memory_mib"`
	RSSBytes     int64             `json:"rss_bytes"`
	Labels       map[string]string `json:"labels"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
	IdleTimeout  string            `json:"idle_timeout"`
	Host         string            `json:"host"`
	AuditLimited *api.AuditLimit   `json:"audit_limited"`
	Containment  string            `json:"containment"`
}

// auditLimitedMark flags, in the EGRESS column, a sandbox that keeps hitting its audit limit.
func auditLimitedMark(l *api.AuditLimit) string {
	if l == nil {
		return ""
	}
	return " (audit limited)"
}

func egressColumn(e api.Egress) string {
	switch e.Mode {
	case api.EgressAllowAll:
		if !e.AllowAllUntil.IsZero() {
			return "allow-all until " + e.AllowAllUntil.Local().Format("01-02 15:04")
		}
	case api.EgressCurated:
		return fmt.Sprintf("curated(%d)", len(e.Allow))
	}
	return dash(e.Mode)
}

// ageColumn is the sandbox's age, and the time it has left when it has a --ttl.
func ageColumn(sb api.Sandbox) string {
	var notes []string
	if !sb.ExpiresAt.IsZero() {
		notes = append(notes, "ttl "+duration(time.Until(sb.ExpiresAt)))
	}
	if sb.IdleTimeout != "" {
		notes = append(notes, "idle "+sb.IdleTimeout)
	}
	if len(notes) == 0 {
		return age(sb.CreatedAt)
	}
	return age(sb.CreatedAt) + " (" + strings.Join(notes, ", ") + ")"
}

func age(t time.Time) string { return duration(time.Since(t)) }

// duration is d in its largest whole unit: 42s, 5m, 3h, 9d.
func duration(d time.Duration) string {
	d = max(d, 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func applyCommand(use string, verb api.Lifecycle, short string) *cobra.Command {
	var sel []string
	var force bool
	cmd := &cobra.Command{
		Use:   use + " NAME… | -l key=value",
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), api.CreateTimeout)
			defer cancel()
			results, err := c.Apply(ctx, verb, api.NamesRequest{Names: args, Selector: sel, Force: force})
			if err != nil {
				return err
			}
			failed := 0
			for i, r := range results {
				if r.Error != "" {
					failed++
					continue
				}
				if verb == api.Remove {
					results[i].State = "removed" // the record is gone: JSON says what the text says
				}
			}
			asJSON := printedJSON(cmd, results)
			for _, r := range results {
				switch {
				case r.Error != "" && asJSON:
					json.NewEncoder(cmd.ErrOrStderr()).Encode(ErrorJSON{Error: ErrorBody{Code: r.Code, Message: strings.TrimPrefix(r.Error, "nexus: ")}})
				case r.Error != "":
					fmt.Fprintf(cmd.ErrOrStderr(), "nexus: %s\n", strings.TrimPrefix(r.Error, "nexus: "))
				case !asJSON:
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", r.Name, r.State)
				}
			}
			if len(results) == 0 && !asJSON {
				fmt.Fprintf(cmd.ErrOrStderr(), "nexus: no sandbox matched -l %s: nothing to %s\n", strings.Join(sel, " -l "), use)
			}
			if failed > 0 {
				for _, r := range results {
					if r.Code == errdefs.CodeInvalid {
						return ExitError{Code: 2}
					}
				}
				return ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&sel, "selector", "l", nil, "label selector k=v, k!=v or k (in a value, \\ escapes , and \\)")
	if use == "rm" || use == "stop" {
		cmd.Flags().BoolVarP(&force, "force", "f", false, map[string]string{"rm": "remove running sandboxes too", "stop": "kill instead of a clean shutdown"}[use])
	}
	return cmd
}
