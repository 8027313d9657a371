package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// delegateCommand is `nexus delegate`: worktree delegation on the gateway's delegate.* verbs,
// the same API as the MCP delegate_* tools.
func delegateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delegate",
		Short: "Hand a git worktree of a host repo to an agent in its own sandbox (create, dispatch, poll, teardown)",
		Long: "A delegation is a git worktree of a host repository on a new branch nexus/<name>, mounted at /workspace of\n" +
			"its own sandbox. The agent commits there; poll copies its branch into the repository; teardown removes\n" +
			"the sandbox and the worktree and keeps the branch.",
	}
	cmd.AddCommand(delegateCreateCommand(), delegateDispatchCommand(), delegatePollCommand(), delegateTeardownCommand())
	return cmd
}

func delegateCreateCommand() *cobra.Command {
	var r api.DelegateCreateRequest
	cmd := &cobra.Command{
		Use:   "create [REPO]",
		Short: "Create a worktree of REPO (default: the current directory) on branch nexus/NAME and a sandbox with it at /workspace",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			repo := "."
			if len(args) == 1 {
				repo = args[0]
			}
			abs, err := filepath.Abs(repo)
			if err != nil {
				return errdefs.Invalid("repo %s: %v", repo, err)
			}
			r.RepoPath = abs
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			return booting(cmd, c, "", api.DelegateTimeout, func(ctx context.Context, progress string) (*api.WorktreeResult, error) {
				r.Progress = progress
				return c.DelegateCreate(ctx, r)
			}, func(w io.Writer, wt *api.WorktreeResult, took time.Duration) {
				state := api.State("")
				if wt.Record != nil {
					state = wt.Record.State
				}
				fmt.Fprintf(w, "%s %s in %.1fs: worktree %s on branch %s (from %s)\n", wt.Sandbox, state, took.Seconds(), wt.Worktree, wt.Branch, short(wt.Base))
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&r.Name, "name", "", "delegation name: branch nexus/NAME, sandbox NAME (default task-<random>)")
	f.StringVar(&r.Base, "base", "", "commit-ish the branch starts from (default HEAD)")
	f.StringVar(&r.Project, "project", "", "project of the sandbox (default \"default\")")
	f.StringVar(&r.Image, "image", "", "root image (default nexus-base; it has git)")
	memoryFlag(f, &r.Memory)
	f.IntVar(&r.VCPUs, "vcpus", 0, "virtual CPUs (default 1)")
	f.StringVar(&r.Agent, "agent", "", agentFlagHelp)
	f.StringVar(&r.Egress, "egress", "", "egress mode: curated, allow-all[=DURATION] or none")
	f.StringArrayVar(&r.AllowedHosts, "allow-host", nil, "extra host the sandbox may reach, HOST[:PORT] (repeatable)")
	return cmd
}

func delegateDispatchCommand() *cobra.Command {
	var brief, briefFile string
	cmd := &cobra.Command{
		Use: "dispatch SANDBOX (--brief TEXT | --brief-file FILE) [-- COMMAND [ARG…]]",
		Short: "Write the brief to " + api.BriefPath + " in the guest and start the agent on it, detached; " +
			"returns once the brief is delivered, not when the work is done",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := api.DispatchRequest{Sandbox: args[0], Brief: brief}
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				if dash != 1 {
					return usageError{errors.New("delegate dispatch: name one sandbox before --")}
				}
				r.Command = args[1:]
			} else if len(args) > 1 {
				return usageError{errors.New("delegate dispatch: put the agent command after --")}
			}
			switch {
			case brief != "" && briefFile != "":
				return usageError{errors.New("delegate dispatch: give --brief or --brief-file, not both")}
			case briefFile == "-":
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), api.MaxBrief+1))
				if err != nil {
					return err
				}
				r.Brief = string(b)
			case briefFile != "":
				b, err := os.ReadFile(briefFile)
				if err != nil {
					return errdefs.Invalid("delegate dispatch: --brief-file: %v", err)
				}
				r.Brief = string(b)
			}
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), api.DispatchTimeout)
			defer cancel()
			res, err := c.DelegateDispatch(ctx, r)
			if err != nil {
				return err
			}
			if !printedJSON(cmd, res) {
				fmt.Fprintf(cmd.OutOrStdout(), "brief delivered to %s: agent pid %d (%s), output in %s\n", res.Sandbox, res.PID, strings.Join(res.Command, " "), res.Log)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&brief, "brief", "", "the task, in prose")
	cmd.Flags().StringVar(&briefFile, "brief-file", "", "read the brief from FILE (- for stdin)")
	return cmd
}

func delegatePollCommand() *cobra.Command {
	var commits int
	cmd := &cobra.Command{
		Use:   "poll SANDBOX",
		Short: "Show a delegation's progress: its branch (copied into the repository), recent commits and git status",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			p, err := c.DelegatePoll(cmd.Context(), api.PollRequest{Sandbox: args[0], Commits: commits})
			if err != nil {
				return err
			}
			if printedJSON(cmd, p) {
				return nil
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "sandbox:  %s\nbranch:   %s\n", p.Sandbox, p.Branch)
			if p.Head != "" {
				fmt.Fprintf(w, "head:     %s (the worktree is not on the delegation's branch)\n", p.Head)
			}
			fmt.Fprintf(w, "agent:    %s\n", dash(p.Agent))
			if p.Dirty {
				fmt.Fprintf(w, "status:   %d changed\n", len(p.Status))
				for _, l := range p.Status {
					fmt.Fprintf(w, "  %s\n", l)
				}
			} else {
				fmt.Fprintln(w, "status:   clean")
			}
			fmt.Fprintln(w, "commits:")
			for _, l := range p.Log {
				fmt.Fprintf(w, "  %s\n", l)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&commits, "commits", 0, fmt.Sprintf("how many recent commits (default %d, at most %d)", api.DefaultPollCommits, api.MaxPollCommits))
	return cmd
}

func delegateTeardownCommand() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "teardown SANDBOX",
		Short: "Remove a delegation's sandbox and worktree; the branch and its commits stay (a dirty worktree needs --force)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), api.DelegateTimeout)
			defer cancel()
			res, err := c.DelegateTeardown(ctx, api.TeardownRequest{Sandbox: args[0], Force: force})
			var dirty *api.DirtyError
			if errors.As(err, &dirty) {
				return errdefs.Conflict("worktree %s of %s has uncommitted changes in %d files: %s; commit them or pass --force to discard them",
					dirty.Worktree, dirty.Sandbox, len(dirty.ChangedFiles), strings.Join(dirty.ChangedFiles, ", "))
			}
			if err != nil {
				return err
			}
			if printedJSON(cmd, res) {
				return nil
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s removed with its worktree %s; branch %s kept at %s\n", res.Sandbox, res.Worktree, res.Branch, dash(short(res.Head)))
			if len(res.Discarded) > 0 {
				fmt.Fprintf(w, "discarded: %s\n", strings.Join(res.Discarded, ", "))
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "discard uncommitted changes")
	return cmd
}

// short abbreviates a commit id for people.
func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}
