package cli

import (
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
)

func portsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ports [[project/]NAME]",
		Short: "List guest ports forwarded to the same port on 127.0.0.1, and conflicts",
		Long: "Guest TCP listeners on ports " + strconv.Itoa(portfwdapi.MinPort) + "-" + strconv.Itoa(portfwdapi.MaxPort) +
			" appear at the same port on 127.0.0.1 (ADDRESS) of the host the sandbox runs on (HOST). A port already\ntaken" +
			" on the host, or by another sandbox first, is listed as a conflict with what holds it; the number is\n" +
			"never changed. Without a name, the forwards of every host.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			list, err := c.Ports(cmd.Context(), name)
			if err != nil {
				return err
			}
			if printedJSON(cmd, list) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SANDBOX\tHOST\tPORT\tADDRESS\tSTATE\tHOLDER\tSINCE")
			for _, f := range list {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", f.Sandbox, dash(f.Host), f.Port, f.HostAddr, f.State, dash(f.Holder), age(f.Since))
			}
			return tw.Flush()
		},
	}
	return cmd
}
