package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// DownResult is what `nexus down --json` prints.
type DownResult struct {
	// Services are the services asked to stop, PIDs their processes on this host.
	Services []string `json:"services"`
	PIDs     []int    `json:"pids"`
	// Sandboxes are the sandboxes stopped first (--all); without it they keep running.
	Sandboxes []api.Result `json:"sandboxes,omitempty"`
}

// downWait bounds how long down waits for the stack's processes to end.
const downWait = time.Minute

func downCommand() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop the stack on this host (sandboxes keep running unless --all)",
		Long: `Stop the stack on this host: every nexus process (nexus up, or each nexus serve) gets
SIGTERM, and down returns once they are gone. Sandboxes outlive the stack: their VMs keep
running and the next ` + "`nexus up`" + ` re-adopts them. With --all the running and paused sandboxes
are stopped first (their disks are kept).`,
		Example: `  nexus down
  nexus down --all      # stop every sandbox, then the stack`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g, err := Globals(cmd)
			if err != nil {
				return err
			}
			nc, err := bus.Connect(cmd.Context(), g.Bus(bus.UserCLI))
			if errors.Is(err, errdefs.ErrUnavailable) {
				fmt.Fprintf(cmd.ErrOrStderr(), "nexus: no stack is running for %s: nothing to stop\n", g.Home)
				printedJSON(cmd, DownResult{Services: []string{}, PIDs: []int{}})
				return nil
			}
			if err != nil {
				return err
			}
			defer nc.Close()
			var res DownResult
			if all {
				c := api.NewClient(nc)
				list, err := c.List(cmd.Context(), api.ListRequest{All: true})
				if err != nil {
					return err
				}
				var names []string
				for _, s := range list {
					if s.State == api.StateRunning || s.State == api.StatePaused {
						names = append(names, s.Name)
					}
				}
				if len(names) > 0 {
					ctx, cancel := context.WithTimeout(cmd.Context(), api.CreateTimeout)
					res.Sandboxes, err = c.Apply(ctx, api.Stop, api.NamesRequest{Names: names})
					cancel()
					if err != nil {
						return err
					}
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
			rows, err := discover(ctx, nc, 700*time.Millisecond, 0)
			cancel()
			if err != nil {
				return err
			}
			nc.Close()
			host := g.Settings.Host
			if host == "" {
				host = bus.LocalHost // the CLI loads no stack settings: this machine's default
			}
			res.Services, res.PIDs = stackProcesses(rows, host)
			for _, pid := range res.PIDs {
				syscall.Kill(pid, syscall.SIGTERM)
			}
			left := waitGone(cmd.Context(), res.PIDs, downWait)
			if !printedJSON(cmd, res) {
				w := cmd.OutOrStdout()
				for _, r := range res.Sandboxes {
					if r.Error == "" {
						fmt.Fprintf(w, "%s %s\n", r.Name, r.State)
					}
				}
				fmt.Fprintf(w, "stack stopped: %s\n", strings.Join(res.Services, " "))
				if !all {
					fmt.Fprintln(w, "sandboxes keep running; the next `nexus up` re-adopts them")
				}
			}
			for _, r := range res.Sandboxes {
				if r.Error != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "nexus: %s\n", strings.TrimPrefix(r.Error, "nexus: "))
				}
			}
			if len(left) > 0 {
				return fmt.Errorf("nexus: processes %v still run %s after SIGTERM", left, downWait)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "stop the running and paused sandboxes first")
	return cmd
}

// stackProcesses are the services that answered and their distinct processes on host (never
// this one).
func stackProcesses(rows []ServiceStatus, host string) ([]string, []int) {
	services, pids := []string{}, []int{}
	for _, r := range rows {
		if r.Host != host || r.PID <= 0 || r.PID == os.Getpid() {
			continue
		}
		services = append(services, r.Service)
		if !slices.Contains(pids, r.PID) {
			pids = append(pids, r.PID)
		}
	}
	slices.Sort(services)
	return services, pids
}

// waitGone waits until every pid has exited, or wait passes; it returns those still there.
func waitGone(ctx context.Context, pids []int, wait time.Duration) []int {
	deadline := time.Now().Add(wait)
	for {
		var left []int
		for _, pid := range pids {
			if syscall.Kill(pid, 0) == nil {
				left = append(left, pid)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return left
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}
