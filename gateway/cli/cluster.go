package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// clusterCommand is `nexus cluster`: this host's membership of a multi-host bus (DESIGN §10).
func clusterCommand() *cobra.Command {
	cl := &cobra.Command{Use: "cluster", Short: "Make this host the first of a cluster, join one, manage join tokens"}
	var (
		name, host, advertise, listen string
		clientPort, routePort         int
		control                       bool
	)
	addNodeFlags := func(c *cobra.Command) {
		c.Flags().StringVar(&host, "host", "", "this host's name in the cluster (its services serve nexus.<service>.<host>.*)")
		c.Flags().StringVar(&advertise, "advertise", "", "the address (IP or DNS name) the other hosts reach this one at")
		c.Flags().StringVar(&listen, "listen", "", "the address the bus binds its client and route ports to (default every interface)")
		c.Flags().IntVar(&clientPort, "client-port", bus.DefaultPort, "the bus's client port (TLS)")
		c.Flags().IntVar(&routePort, "route-port", bus.DefaultRoutePort, "the bus's route port (mutual TLS)")
	}
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Make this host the first node of a new cluster: its CA, its certificate, route credentials",
		Long: `Make this host the first node of a new cluster. It writes the cluster CA and this node's
certificate under $NEXUS_HOME/cluster; from its next start the bus listens beyond loopback with
TLS only, authenticated users only, and routes to its peers with mutual TLS. Run it with the
stack stopped. JetStream serves once two nodes are up (a quorum); run three for R3.

The home's single-host store is kept aside (bus/jetstream.single-host) and, once the cluster's
store serves, its bus copies the sandbox, snapshot and port-forward records and the audit and
lifecycle events into it before the services start (once; see ` + "`nexus cluster migrate`" + `).`,
		Example: "  nexus cluster init --host a --advertise 10.0.0.1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g, err := Globals(cmd)
			if err != nil {
				return err
			}
			c, err := bus.Init(bus.InitConfig{Home: g.Home, Name: name, Host: host, Advertise: advertise, Listen: listen, ClientPort: clientPort, RoutePort: routePort})
			if err != nil {
				return err
			}
			if printedJSON(cmd, c.Public()) {
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "host %s is the first node of cluster %s: clients at %s, routes at %s\nnext: start the stack, then `nexus cluster token create` for each host that joins\n",
				c.Host, c.Name, c.ClientURL(), c.RouteURL())
			return nil
		},
	}
	addNodeFlags(initCmd)
	initCmd.Flags().StringVar(&name, "name", "nexus", "the cluster's name")

	join := &cobra.Command{
		Use:   "join TOKEN",
		Short: "Join this host to a cluster with a token from `nexus cluster token create`",
		Long: `Join this host to a cluster. The token names the cluster's bus and pins its CA; this host
sends its public key and gets its certificate back. Run it with this host's stack stopped; its
single-host JetStream store is kept aside (bus/jetstream.before-join), the cluster's is used;
` + "`nexus cluster migrate --from`" + ` copies its records and audit history in later.
Without --control the host is a worker: its bus has no gateway, credbroker or admin user.`,
		Example: "  nexus cluster join nxjoin1.eyJ1Ijpb... --host b --advertise 10.0.0.2",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g, err := Globals(cmd)
			if err != nil {
				return err
			}
			c, err := bus.Join(cmd.Context(), bus.JoinConfig{Home: g.Home, Token: args[0], Host: host, Advertise: advertise, Listen: listen,
				ClientPort: clientPort, RoutePort: routePort, Control: control})
			if err != nil {
				return err
			}
			if printedJSON(cmd, c.Public()) {
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "host %s joined cluster %s: start its stack (nexus up, or nexus serve bus and the services)\n", c.Host, c.Name)
			return nil
		},
	}
	addNodeFlags(join)
	join.Flags().BoolVar(&control, "control", false, "this host runs a gateway and credbroker too")

	cl.AddCommand(initCmd, join, clusterTokenCommand(), clusterMigrateCommand())
	return cl
}

// clusterMigrateCommand is `nexus cluster migrate`: copy a store set aside by init or join
// into the cluster's (the bus does it by itself for init's once the store serves).
func clusterMigrateCommand() *cobra.Command {
	var from, as string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Copy the records and audit history of a store set aside by init or join into the cluster's",
		Long: `Copy a JetStream store that ` + "`nexus cluster init`" + ` or ` + "`join`" + ` set aside into the cluster's store:
the sandbox, snapshot and port-forward records the cluster does not have yet (their host "local"
becomes this host; a record the cluster has under the same name is kept, never overwritten),
then every audit and lifecycle event in order. The store set aside is only read, and stays as it
is. It runs once per store: a marker next to it (<store>.migrated) records it, and a run cut
off is resumed by the next without copying anything twice.

The host that ran init migrates bus/jetstream.single-host by itself once the cluster's store
serves, before its services start; this command is for the store a joining host set aside
(bus/jetstream.before-join), which is not migrated by itself: its sandboxes' names may be taken
in the cluster already. Run it on a control host (init's, or one joined with --control) with
its bus up and the cluster's store serving; for a worker's store, copy its directory to the
control host and name the worker with --host.`,
		Example: "  nexus cluster migrate --from ~/.local/share/nexus/bus/jetstream.before-join\n  nexus cluster migrate --from /tmp/b-before-join --host b   # a worker's store, copied here",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g, err := Globals(cmd)
			if err != nil {
				return err
			}
			c, ok, err := bus.LoadCluster(g.Home)
			if err != nil {
				return err
			}
			if !ok {
				return usageError{fmt.Errorf("this home is in no cluster: `nexus cluster init` or `join` first")}
			}
			if !c.Control {
				return errdefs.Refused("host %s is a worker: its bus has no admin user to write the cluster's records; run the migration on a control host", c.Host)
			}
			if from == "" {
				from = bus.SingleHostStore(g.Home)
			}
			ctx := cmd.Context()
			nc, err := bus.Connect(ctx, g.Bus(bus.UserAdmin))
			if err != nil {
				return err
			}
			defer nc.Close()
			sctx, cancel := bus.StoreContext(ctx)
			err = bus.StoreReady(sctx, nc)
			cancel()
			if err != nil {
				return errdefs.Unavailable("the cluster's store does not serve yet (a quorum of its bus nodes, two of three, must be up): %v", err)
			}
			if as == "" {
				as = c.Host
			}
			st, err := bus.Migrate(ctx, bus.MigrateConfig{From: from, To: nc, Host: as, Log: g.Log})
			if err != nil {
				return err
			}
			if printedJSON(cmd, st) {
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout(), st.String())
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the store set aside (default $NEXUS_HOME/bus/jetstream.single-host)")
	cmd.Flags().StringVar(&as, "host", "", "the host the store's sandboxes run on: their host \"local\" becomes it (default this host)")
	return cmd
}

func clusterTokenCommand() *cobra.Command {
	tok := &cobra.Command{Use: "token", Short: "Create, list and revoke the tokens hosts join with (on the host that ran init)"}
	var ttl time.Duration
	create := &cobra.Command{
		Use:     "create",
		Short:   "Create a join token and print it once (it is stored only hashed)",
		Example: "  nexus cluster token create --ttl 30m",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g, err := Globals(cmd)
			if err != nil {
				return err
			}
			c, ok, err := bus.LoadCluster(g.Home)
			if err != nil {
				return err
			}
			if !ok {
				return usageError{fmt.Errorf("this home is in no cluster: `nexus cluster init` first")}
			}
			t, token, err := bus.CreateToken(g.Home, []string{c.ClientURL()}, ttl)
			if err != nil {
				return err
			}
			if printedJSON(cmd, map[string]any{"id": t.ID, "expires": t.Expires, "token": token}) {
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout(), token)
			fmt.Fprintf(cmd.ErrOrStderr(), "join token %s, valid until %s: on the joining host run nexus cluster join TOKEN --host NAME --advertise ADDR\n",
				t.ID, t.Expires.Format(time.RFC3339))
			return nil
		},
	}
	create.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token admits hosts")
	ls := &cobra.Command{
		Use:     "ls",
		Short:   "List the join tokens (ids, expiry, hosts that joined; never secrets)",
		Example: "  nexus cluster token ls --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g, err := Globals(cmd)
			if err != nil {
				return err
			}
			ts, err := bus.Tokens(g.Home)
			if err != nil {
				return err
			}
			type row struct {
				ID      string    `json:"id"`
				State   string    `json:"state"`
				Expires time.Time `json:"expires"`
				Joined  []string  `json:"joined"`
			}
			rows := []row{}
			now := time.Now()
			for _, t := range ts {
				st := "usable"
				switch {
				case t.Revoked:
					st = "revoked"
				case !t.Usable(now):
					st = "expired"
				}
				rows = append(rows, row{t.ID, st, t.Expires, append([]string{}, t.Joined...)})
			}
			if printedJSON(cmd, rows) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tEXPIRES\tJOINED")
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\n", r.ID, r.State, r.Expires.Format(time.RFC3339), r.Joined)
			}
			return tw.Flush()
		},
	}
	revoke := &cobra.Command{
		Use:     "revoke ID",
		Short:   "Revoke a join token: no host joins with it any more",
		Example: "  nexus cluster token revoke 3f2a9c0d1e7b",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g, err := Globals(cmd)
			if err != nil {
				return err
			}
			if err := bus.RevokeToken(g.Home, args[0]); err != nil {
				return err
			}
			if printedJSON(cmd, map[string]any{"id": args[0], "revoked": true}) {
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "join token %s revoked\n", args[0])
			return nil
		},
	}
	tok.AddCommand(create, ls, revoke)
	return tok
}
