package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

func agentCommand() *cobra.Command {
	c := &cobra.Command{Use: "agent", Short: "Agent profiles, and agents run in ephemeral sandboxes"}
	c.AddCommand(launchCommand(), agentListCommand())
	return c
}

// agentFlagHelp is the help of every --agent flag: the profiles there are.
var agentFlagHelp = "agent profile: " + strings.Join(profile.Names(), ", ") + " (default " + profile.DefaultName +
	"); nexus agent ls shows their hosts and credentials"

// AgentInfo is one row of `nexus agent ls`.
type AgentInfo struct {
	Name    string   `json:"name"`
	Default bool     `json:"default"`
	Hosts   []string `json:"hosts"`
	// Credentials says how the agent gets its credentials into the guest.
	Credentials string   `json:"credentials"`
	Command     []string `json:"command"`
}

// agentInfo describes prof for people: its hosts and how its credentials reach the guest.
func agentInfo(prof profile.Profile) AgentInfo {
	var creds []string
	if prof.CredDirLiveMount {
		c := "~/" + prof.CredDir + " mounted at " + prof.GuestCredPath
		if prof.CredentialsFile != "" {
			c += " (OAuth token kept fresh on the host)"
		}
		creds = append(creds, c)
	}
	for _, s := range prof.Secrets {
		creds = append(creds, fmt.Sprintf("secret %s as a placeholder in $%s, swapped for %s (nexus secret set %s)", s.Name, s.Env, strings.Join(s.Hosts, ","), s.Name))
	}
	if len(creds) == 0 {
		creds = append(creds, "none")
	}
	return AgentInfo{Name: prof.Name, Default: prof.Name == profile.DefaultName, Hosts: prof.EgressHosts, Credentials: strings.Join(creds, "; "), Command: prof.LaunchCommand}
}

func agentListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Short:   "List the agent profiles (--agent NAME): their egress hosts and how credentials reach the guest",
		Example: "  nexus agent ls\n  nexus create demo/t1 --agent codex",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var list []AgentInfo
			for _, p := range profile.All() {
				list = append(list, agentInfo(p))
			}
			if printedJSON(cmd, list) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHOSTS\tCREDENTIALS\tCOMMAND")
			for _, a := range list {
				name := a.Name
				if a.Default {
					name += " (default)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, strings.Join(a.Hosts, ","), a.Credentials, strings.Join(a.Command, " "))
			}
			return tw.Flush()
		},
	}
}

// herdrCommand is the plugin-private group of the herdr workspace plugin; its launch is the
// same command as `nexus agent launch`.
func herdrCommand() *cobra.Command {
	c := &cobra.Command{Use: "herdr", Short: "Commands used by the herdr workspace plugin"}
	c.AddCommand(launchCommand())
	return c
}

// launchOptions are the flags of `nexus agent launch`.
type launchOptions struct {
	agentEgress bool
	agent       string
	verbose     bool
	memoryMiB   int
	vcpus       int
}

func launchCommand() *cobra.Command {
	var o launchOptions
	cmd := &cobra.Command{
		Use:   "launch [--agent-egress] [--agent NAME] [-v] IMAGE COMMAND [ARGS…]",
		Short: "Boot an ephemeral sandbox, run COMMAND in it attached to this terminal, then remove it",
		Long: `Boot an ephemeral sandbox from IMAGE, run COMMAND (an absolute path) in it attached to this
terminal, and remove the sandbox when the command ends, on error and on interrupt too. The exit
status is the command's. While it runs this process holds a lease; if it dies, even by SIGKILL,
the gateway removes the sandbox within seconds.

Without --agent-egress the sandbox has no network at all. With it, the sandbox gets the agent
profile's egress perimeter (its allowlist, the MITM, credentials and the credential guardian).`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error { return launch(cmd, o, args[0], args[1:]) },
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // everything after IMAGE belongs to COMMAND
	f.BoolVar(&o.agentEgress, "agent-egress", false, "give the sandbox the agent profile's egress perimeter (default: no egress at all)")
	f.StringVar(&o.agent, "agent", "", agentFlagHelp)
	f.BoolVarP(&o.verbose, "verbose", "v", false, "print boot steps and the egress perimeter before running")
	memoryFlag(f, &o.memoryMiB)
	f.IntVar(&o.vcpus, "vcpus", 0, "virtual CPUs (default 1)")
	return cmd
}

// forbiddenArg is refused anywhere in a launch's argv, for every agent.
const forbiddenArg = "--dangerously-skip-permissions"

// LaunchArgv checks argv (COMMAND and its arguments) and returns what runs in the guest. COMMAND
// must be an absolute path. When COMMAND is the profile's agent (same program name as its launch
// command), the launch command's flags are added unless argv already carries them: claude-code
// runs with --permission-mode auto. Skipping permission checks is refused whatever the agent.
func LaunchArgv(prof profile.Profile, argv []string) ([]string, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, errdefs.Invalid("agent launch: COMMAND is missing")
	}
	if !path.IsAbs(argv[0]) {
		return nil, errdefs.Invalid("agent launch: COMMAND must be an absolute path (e.g. /usr/local/bin/claude), not %q", argv[0])
	}
	for _, a := range argv {
		if a == forbiddenArg || strings.HasPrefix(a, forbiddenArg+"=") || strings.HasPrefix(a, "--allow-dangerously-skip-permissions") {
			return nil, errdefs.Invalid("agent launch: %s is refused: agents in nexus sandboxes keep their permission checks (claude runs with --permission-mode auto)", a)
		}
		if strings.EqualFold(strings.TrimPrefix(a, "--permission-mode="), "bypassPermissions") {
			return nil, errdefs.Invalid("agent launch: permission mode bypassPermissions is refused: claude runs with --permission-mode auto")
		}
	}
	out := append([]string{}, argv...)
	if len(prof.LaunchCommand) < 2 || path.Base(argv[0]) != path.Base(prof.LaunchCommand[0]) {
		return out, nil
	}
	// The launch command's extra words are --flag value pairs (or --flag alone).
	want := prof.LaunchCommand[1:]
	var add []string
	for i := 0; i < len(want); i++ {
		flag := want[i]
		value, hasValue := "", i+1 < len(want) && !strings.HasPrefix(want[i+1], "-")
		if hasValue {
			value = want[i+1]
			i++
		}
		got, present := flagValue(argv[1:], flag)
		switch {
		case !present:
			add = append(add, flag)
			if hasValue {
				add = append(add, value)
			}
		case hasValue && got != value:
			return nil, errdefs.Invalid("agent launch: %s %s is refused: %s agents run with %s %s", flag, got, prof.Name, flag, value)
		}
	}
	return append(append([]string{out[0]}, add...), out[1:]...), nil
}

// flagValue finds --flag VALUE or --flag=VALUE in args (before a "--").
func flagValue(args []string, flag string) (string, bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		if a == flag {
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", true
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

// launchName is a fresh sandbox name in project launch.
func launchName() string {
	b := make([]byte, 5)
	rand.Read(b)
	return "launch/" + hex.EncodeToString(b)
}

// launch creates an ephemeral sandbox, holds its lease, runs argv attached to the caller's
// terminal and removes the sandbox whatever happens; the result is the command's exit status.
func launch(cmd *cobra.Command, o launchOptions, image string, argv []string) error {
	if err := refuseJSON(cmd, "it runs COMMAND attached to this terminal"); err != nil {
		return err
	}
	agent := o.agent
	if agent == "" {
		agent = profile.DefaultName
	}
	prof, err := profile.Get(agent)
	if err != nil {
		return err
	}
	argv, err = LaunchArgv(prof, argv)
	if err != nil {
		return err
	}
	c, _, err := dial(cmd)
	if err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	// The first interrupt (or hangup) ends the command and removes the sandbox; the process
	// stays to finish that. A second one leaves at once: the lapsed lease removes the sandbox.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	runCtx, interrupt := context.WithCancel(cmd.Context())
	defer interrupt()
	go func() {
		n := 0
		for range sigs {
			if n++; n > 1 {
				os.Exit(130)
			}
			interrupt()
		}
	}()

	req := api.CreateRequest{Name: launchName(), Image: image, Agent: agent, MemoryMiB: o.memoryMiB, VCPUs: o.vcpus,
		Ephemeral: true}
	if !o.agentEgress {
		req.EgressMode = api.EgressNone // no NIC at all: not open egress
	}
	stopProgress := func() {}
	if o.verbose {
		fmt.Fprintf(stderr, "nexus: launching %s (image %s, agent %s)\n", req.Name, image, agent)
		req.Progress, stopProgress = followSteps(c.Conn(), "", stderr)
	}
	// The create is not cancelled by an interrupt: the gateway finishes the boot either way, and
	// only then can the sandbox be removed cleanly.
	type created struct {
		sb  *api.Sandbox
		err error
	}
	done := make(chan created, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), api.CreateTimeout)
		defer cancel()
		sb, err := c.Create(ctx, req)
		done <- created{sb, err}
	}()
	var res created
	select {
	case res = <-done:
	case <-runCtx.Done():
		fmt.Fprintf(stderr, "nexus: interrupted; removing %s once its boot ends\n", req.Name)
		res = <-done
	}
	stopProgress()
	// Teardown: the sandbox first (waiting for all of it to go), then the lease.
	var lease *api.Lease
	defer func() {
		removeLaunched(c, req.Name, stderr)
		if lease != nil {
			lease.Release()
		}
	}()
	if res.err != nil {
		return res.err
	}
	if runCtx.Err() != nil {
		return ExitError{Code: 130}
	}
	if lease, err = c.HoldLease(context.Background(), res.sb.ID); err != nil {
		return err
	}
	if o.verbose {
		printPerimeter(cmd.Context(), c, req.Name, stderr)
	}

	stdin := cmd.InOrStdin()
	run := api.ExecRequest{Name: req.Name, Argv: argv, Stdin: true}
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		run.TTY = true // a pty in the guest, raw mode and resizes here (runExec)
		run.Env = []string{"TERM=" + envOr("TERM", "xterm-256color")}
	}
	code, err := runExec(runCtx, c, run, stdin, cmd.OutOrStdout(), stderr)
	if err != nil {
		return err
	}
	if runCtx.Err() != nil && code == 0 {
		code = 130
	}
	return ExitError{Code: code}
}

// removeLaunched removes a launched sandbox and waits for its teardown; one that is already
// gone is fine.
func removeLaunched(c *api.Client, name string, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results, err := c.Apply(ctx, api.Remove, api.NamesRequest{Names: []string{name}, Force: true})
	if err != nil {
		fmt.Fprintf(stderr, "nexus: remove %s: %v (the gateway removes it once the lease lapses)\n", name, err)
		return
	}
	for _, r := range results {
		if r.Error != "" && r.Code != "not_found" {
			fmt.Fprintf(stderr, "nexus: remove %s: %s\n", name, r.Error)
		}
	}
}

// printPerimeter prints what `nexus egress show` would, briefly, to w.
func printPerimeter(ctx context.Context, c *api.Client, name string, w io.Writer) {
	v, err := c.EgressShow(ctx, name)
	if err != nil {
		var msg string
		if !errors.Is(err, context.Canceled) {
			msg = err.Error()
		}
		fmt.Fprintf(w, "nexus: egress: %s\n", msg)
		return
	}
	fmt.Fprintf(w, "  egress mode    %s\n", v.Egress.Mode)
	if len(v.Egress.Allow) > 0 {
		fmt.Fprintf(w, "  egress allow   %s\n", strings.Join(v.Egress.Allow, " "))
	}
	if len(v.Secrets) > 0 {
		fmt.Fprintf(w, "  secrets        %s (placeholders in the guest)\n", strings.Join(v.Secrets, " "))
	}
	if v.Network == nil {
		fmt.Fprintln(w, "  network        none (no packet leaves)")
		return
	}
	fmt.Fprintf(w, "  network        %s (guest %s, gateway/dns %s)\n", v.Network.EffectiveMode, v.Network.GuestIP, v.Network.GatewayIP)
}
