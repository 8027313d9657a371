package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/IniZio/nexus/pkg/bus"
)

// hostsCommand is `nexus hosts`: the hosts of the cluster with their state and load, from their
// heartbeats in nexus_hosts, and `nexus hosts drain` (DESIGN §10).
func hostsCommand() *cobra.Command {
	open := func(cmd *cobra.Command) (jetstream.KeyValue, func(), error) {
		g, err := Globals(cmd)
		if err != nil {
			return nil, nil, err
		}
		nc, err := bus.Connect(cmd.Context(), g.Bus(bus.UserCLI))
		if err != nil {
			return nil, nil, err
		}
		ctx, cancel := bus.StoreContext(cmd.Context())
		defer cancel()
		kv, err := bus.KV(ctx, nc, bus.KVHosts)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return kv, nc.Close, nil
	}
	hosts := &cobra.Command{
		Use:   "hosts",
		Short: "List the hosts with their state (up, draining, lost) and load",
		Long: `List the hosts from their heartbeats: state (up, draining, or lost once a host has been
silent for ` + bus.HostTTL.String() + `), running sandboxes, memory the sandboxes hold of what they may take, cores
and free disk. New sandboxes are placed on the host up with the most free memory. A lost host
also shows how many sandboxes removed meanwhile it still holds (pending_removals under --json):
their VMs and disks go when it is back.`,
		Example: "  nexus hosts\n  nexus hosts --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kv, done, err := open(cmd)
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := bus.StoreContext(cmd.Context())
			defer cancel()
			hs, err := bus.Hosts(ctx, kv, time.Now())
			if err != nil {
				return err
			}
			if printedJSON(cmd, hs) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "HOST\tSTATE\tRUNNING\tMEMORY\tVCPUS\tDISK FREE\tLAST SEEN")
			for _, h := range hs {
				state := h.State
				if h.PendingRemovals > 0 { // removed while it was lost: cleaned up once it is back
					state += fmt.Sprintf(" (%d removed sandboxes to clean up)", h.PendingRemovals)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d MiB\t%d\t%d GiB\t%s ago\n", h.Host, state, h.Running, h.MemoryUsedMiB, h.MemoryMiB, h.VCPUs,
					h.DiskFree>>30, time.Since(h.At).Round(time.Second))
			}
			return tw.Flush()
		},
	}
	drain := func(on bool) *cobra.Command {
		use, short, done := "drain HOST", "Place nothing new on HOST (its sandboxes keep running)", "drained"
		if !on {
			use, short, done = "undrain HOST", "Place on HOST again", "undrained"
		}
		return &cobra.Command{
			Use:     use,
			Short:   short,
			Example: "  nexus hosts " + use[:len(use)-5] + " b",
			Args:    cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				kv, closeBus, err := open(cmd)
				if err != nil {
					return err
				}
				defer closeBus()
				ctx, cancel := bus.StoreContext(cmd.Context())
				defer cancel()
				if err := bus.Drain(ctx, kv, args[0], on); err != nil {
					return err
				}
				if printedJSON(cmd, map[string]any{"host": args[0], "drained": on}) {
					return nil
				}
				fmt.Fprintf(cmd.OutOrStdout(), "host %s %s\n", args[0], done)
				return nil
			},
		}
	}
	hosts.AddCommand(drain(true), drain(false))
	return hosts
}
