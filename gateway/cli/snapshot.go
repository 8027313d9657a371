package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

func init() { extraCommands = append(extraCommands, snapshotCommand, forkCommand, volumeCommand) }

func snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Snapshot running sandboxes (memory, device state and disk) to fork them later"}
	var asJSON bool
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
			if asJSON {
				printJSON(cmd.OutOrStdout(), s)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s of %s (%d MiB RAM, %d MiB touched; paused %d ms)\n",
				s.Name, s.Sandbox, s.RAMBytes>>20, s.RAMDataBytes>>20, s.PausedMillis)
			return nil
		},
	}
	create.Flags().BoolVar(&asJSON, "json", false, "print the snapshot as JSON")
	var lsJSON bool
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
			if lsJSON {
				printJSON(cmd.OutOrStdout(), list)
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSANDBOX\tIMAGE\tMEMORY\tTOUCHED\tCHILDREN\tAGE\tHOST")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%dMiB\t%dMiB\t%d\t%s\t%s\n", s.Name, s.Sandbox, s.Image, s.MemoryMiB, s.RAMDataBytes>>20,
					len(s.Children), age(s.CreatedAt), s.Host)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&lsJSON, "json", false, "print JSON")
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
			fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s removed\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}

func forkCommand() *cobra.Command {
	var labels []string
	var asJSON bool
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
			stopProgress := func() {}
			if !asJSON {
				r.Progress, stopProgress = followSteps(c.Conn(), cmd.ErrOrStderr())
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), api.CreateTimeout)
			defer cancel()
			start := time.Now()
			sb, err := c.Fork(ctx, r)
			stopProgress()
			if err != nil {
				return err
			}
			if asJSON {
				printJSON(cmd.OutOrStdout(), sb)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s in %.2fs (forked from %s)\n", sb.Name, sb.State, time.Since(start).Seconds(), args[0])
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label key=value (repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func volumeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "volume", Short: "Named volumes (--mount-named): per-sandbox ext4 disks"}
	var asJSON bool
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
			if asJSON {
				printJSON(cmd.OutOrStdout(), list)
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
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
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
			fmt.Fprintf(cmd.OutOrStdout(), "volume %s of %s removed\n", args[1], args[0])
			return nil
		},
	}
	cmd.AddCommand(ls, rm)
	return cmd
}
