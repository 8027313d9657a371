package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

func snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Snapshot running sandboxes (memory, device state and disk) to fork them later"}
	create := &cobra.Command{
		Use:   "create SANDBOX SNAPSHOT",
		Short: "Snapshot a running sandbox; it is paused for the copy and then resumes",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), api.SnapshotTimeout)
			defer cancel()
			s, err := c.SnapshotCreate(ctx, api.SnapshotCreateRequest{Sandbox: args[0], Snapshot: args[1]})
			if err != nil {
				return err
			}
			if printedJSON(cmd, s) {
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s of %s (%d MiB RAM, %d MiB touched; paused %d ms)\n",
				s.Name, s.Sandbox, s.RAMBytes>>20, s.RAMDataBytes>>20, s.PausedMillis)
			return nil
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List snapshots and the live sandboxes forked from each",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			list, err := c.SnapshotList(cmd.Context())
			if err != nil {
				return err
			}
			if printedJSON(cmd, list) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSANDBOX\tIMAGE\tMEMORY\tTOUCHED\tCHILDREN\tAGE\tHOST")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%dMiB\t%dMiB\t%d\t%s\t%s\n", s.Name, s.Sandbox, s.Image, s.MemoryMiB, s.RAMDataBytes>>20,
					len(s.Children), age(s.CreatedAt), s.Host)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, s := range list {
				if s.Unusable != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s is unusable, no fork can start from it: %s\n", s.Name, s.Unusable)
				}
			}
			return nil
		},
	}
	rm := &cobra.Command{
		Use:   "rm SNAPSHOT",
		Short: "Remove a snapshot (refused while live sandboxes forked from it run; there is no --force)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			if err := c.SnapshotRemove(ctx, args[0]); err != nil {
				return err
			}
			done(cmd, args[0], "removed", "snapshot %s removed\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}

func forkCommand() *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use: "fork SNAPSHOT [project/]NEWNAME",
		Short: "Boot a new sandbox from a snapshot: its processes keep running, with its own identity and perimeter " +
			"(a sandbox name instead of a snapshot is snapshotted first as NEWNAME-base)",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			lb, err := api.ParseLabels(labels)
			if err != nil {
				return err
			}
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			r := api.ForkRequest{Source: args[0], Name: args[1], Labels: lb}
			return booting(cmd, c, "", api.CreateTimeout, func(ctx context.Context, progress string) (*api.Sandbox, error) {
				r.Progress = progress
				return c.Fork(ctx, r)
			}, func(w io.Writer, sb *api.Sandbox, took time.Duration) {
				fmt.Fprintf(w, "%s %s in %.2fs (forked from %s)\n", sb.Name, sb.State, took.Seconds(), args[0])
			})
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label key=value (repeatable)")
	return cmd
}

func volumeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "volume", Short: "Named volumes (--mount-named): per-sandbox ext4 disks"}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List named volumes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			list, err := c.VolumeList(cmd.Context())
			if err != nil {
				return err
			}
			if printedJSON(cmd, list) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SANDBOX\tVOLUME\tGUEST\tSIZE\tUSED\tHOST")
			for _, v := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%dMiB\t%dMiB\t%s\n", dash(v.Sandbox), v.Name, dash(v.Guest), v.SizeBytes>>20, v.UsedBytes>>20, v.Host)
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm SANDBOX VOLUME",
		Short: "Delete a stopped sandbox's named volume and its data",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			if err := c.VolumeRemove(cmd.Context(), api.VolumeRemoveRequest{Sandbox: args[0], Volume: args[1]}); err != nil {
				return err
			}
			sb, err := api.ParseName(args[0])
			if err != nil {
				sb = args[0]
			}
			if !printedJSON(cmd, VolumeResult{Sandbox: sb, Volume: args[1], State: "removed"}) {
				fmt.Fprintf(cmd.OutOrStdout(), "volume %s of %s removed\n", args[1], sb)
			}
			return nil
		},
	}
	cmd.AddCommand(ls, rm)
	return cmd
}
