package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
)

func imageCommand() *cobra.Command {
	img := &cobra.Command{Use: "image", Short: "Build, list and remove root images"}
	var force bool
	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Build a root image (nexus-base: Debian bookworm; nexus-mini: busybox)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			req := vmmapi.ImageRequest{Op: "build", Name: args[0], Force: force}
			var bar *progressbar.ProgressBar
			if !jsonOutput(cmd) {
				interactive := false
				if f, ok := cmd.ErrOrStderr().(*os.File); ok && term.IsTerminal(int(f.Fd())) {
					interactive = true
					bar = progressbar.NewOptions(1000, progressbar.OptionSetWriter(f), progressbar.OptionSetWidth(30),
						progressbar.OptionSetDescription("building "+args[0]), progressbar.OptionClearOnFinish(), progressbar.OptionShowElapsedTimeOnFinish())
				}
				lastStage, lastTenth := "", -1
				subject := bus.StreamPrefix + "." + nuid.Next() + ".out"
				sub, err := c.Conn().Subscribe(subject, func(m *nats.Msg) {
					var p vmmapi.ImageProgress
					if json.Unmarshal(m.Data, &p) != nil {
						return
					}
					if interactive {
						bar.Describe(fmt.Sprintf("%-28s", args[0]+": "+p.Step))
						bar.Set(int(p.Fraction * 1000))
						return
					}
					// Not a terminal (CI, logs): one line per stage and per tenth of the way.
					stage, _, _ := strings.Cut(p.Step, ":")
					if tenth := int(p.Fraction * 10); stage != lastStage || tenth != lastTenth {
						lastStage, lastTenth = stage, tenth
						fmt.Fprintf(cmd.ErrOrStderr(), "  %3.0f%%  %s\n", p.Fraction*100, p.Step)
					}
				})
				if err == nil {
					defer sub.Unsubscribe()
					req.Progress = subject
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), api.ImageTimeout)
			defer cancel()
			var info vmmapi.ImageInfo
			info, err = imageOp(ctx, c, req)
			if bar != nil {
				bar.Finish()
			}
			if err != nil {
				return err
			}
			if printedJSON(cmd, info) {
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d MiB, built %s\n", info.Name, info.SizeBytes>>20, info.Built.Local().Format("2006-01-02 15:04:05"))
			return nil
		},
	}
	build.Flags().BoolVar(&force, "force", false, "rebuild even if the image exists")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List built images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			list, err := c.Images(cmd.Context())
			if err != nil {
				return err
			}
			if printedJSON(cmd, list) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tBUILT")
			for _, i := range list {
				fmt.Fprintf(tw, "%s\t%dMiB\t%s\n", i.Name, i.SizeBytes>>20, age(i.Built)+" ago")
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a built image",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			if _, err := imageOp(cmd.Context(), c, vmmapi.ImageRequest{Op: "rm", Name: args[0]}); err != nil {
				return err
			}
			done(cmd, args[0], "removed", "%s removed\n", args[0])
			return nil
		},
	}
	img.AddCommand(build, ls, rm)
	return img
}

func imageOp(ctx context.Context, c *api.Client, r vmmapi.ImageRequest) (vmmapi.ImageInfo, error) {
	return c.Image(ctx, r)
}
