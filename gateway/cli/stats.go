package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// statsInterval is the time between the two samples a CPU share is computed from, and between
// refreshes with -f.
const statsInterval = 2 * time.Second

func statsCommand() *cobra.Command {
	var sel []string
	var follow bool
	cmd := &cobra.Command{
		Use:   "stats [NAME…]",
		Short: "Show what running sandboxes use: CPU, memory, disk, network",
		Long: "Show what running sandboxes use: the host CPU their VM took over the last " + statsInterval.String() +
			" (100% is one core), memory the guest uses, its limit and what the VM holds of the host's, root disk used on the host and its size, " +
			"bytes their NIC sent and received, and open connections. -f refreshes until interrupted; with --json each sample is one JSON array per line.",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			r := api.StatsRequest{Names: args, Selector: sel}
			prev, err := c.Stats(cmd.Context(), r)
			if err != nil {
				return err
			}
			for {
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(statsInterval):
				}
				cur, err := c.Stats(cmd.Context(), r)
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				withCPUPercent(prev, cur)
				if jsonOutput(cmd) {
					if follow {
						b, _ := json.Marshal(cur)
						fmt.Fprintln(cmd.OutOrStdout(), string(b))
					} else {
						printJSON(cmd.OutOrStdout(), cur)
					}
				} else {
					printStats(cmd, cur)
				}
				if !follow {
					return nil
				}
				prev = cur
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "refresh every "+statsInterval.String()+" until interrupted")
	cmd.Flags().StringArrayVarP(&sel, "selector", "l", nil, "label selector k=v, k!=v or k")
	return cmd
}

// withCPUPercent fills cur's CPU shares from the CPU time each sandbox used since prev.
func withCPUPercent(prev, cur []api.SandboxStats) {
	before := map[string]api.SandboxStats{}
	for _, s := range prev {
		before[s.ID] = s
	}
	for i, s := range cur {
		p, ok := before[s.ID]
		if !ok || s.CPUSeconds < p.CPUSeconds {
			continue
		}
		if wall := s.Time.Sub(p.Time).Seconds(); wall > 0 {
			cur[i].CPUPercent = 100 * (s.CPUSeconds - p.CPUSeconds) / wall
		}
	}
}

func printStats(cmd *cobra.Command, list []api.SandboxStats) {
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tCPU%\tMEMORY (GUEST USED/LIMIT/HOST RSS)\tDISK (USED/SIZE)\tNET (OUT/IN)\tCONNS")
	for _, s := range list {
		used := "-"
		if s.GuestMemUsedBytes > 0 {
			used = human(uint64(s.GuestMemUsedBytes))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%s / %dMiB / %s\t%s / %s\t%s / %s\t%d\n", s.Name, s.State, s.CPUPercent,
			used, s.MemoryMiB, human(uint64(s.RSSBytes)), human(uint64(s.DiskUsedBytes)), human(uint64(s.DiskSizeBytes)),
			human(s.NetOutBytes), human(s.NetInBytes), s.Connections)
	}
	tw.Flush()
}

// human is n bytes in the largest binary unit that keeps it above 1.
func human(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
