package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/IniZio/nexus/pkg/bus"
)

// Expected lists the services a healthy stack runs.
var Expected = bus.Services

// ServiceStatus is one row of `nexus status`.
type ServiceStatus struct {
	Service string    `json:"service"`
	Up      bool      `json:"up"`
	Version string    `json:"version,omitempty"`
	Started time.Time `json:"started,omitzero"`
	Uptime  string    `json:"uptime,omitempty"`
	Host    string    `json:"host,omitempty"`
	PID     int       `json:"pid,omitempty"`
	ID      string    `json:"id,omitempty"`
}

func statusCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every service: up or down, version, uptime, host (exit 1 if any is down)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g, err := Globals(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
			defer cancel()
			rows := []ServiceStatus{}
			nc, connErr := bus.Connect(ctx, g.Bus(bus.UserCLI))
			if connErr == nil {
				defer nc.Close()
				rows, err = Discover(ctx, nc, 700*time.Millisecond)
				if err != nil {
					return err
				}
			}
			rows = withMissing(rows)
			if !printedJSON(cmd, rows) {
				printStatus(cmd.OutOrStdout(), rows)
			}
			if connErr != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), connErr.Error())
			}
			for _, r := range rows {
				if !r.Up {
					return ExitError{Code: 1}
				}
			}
			return nil
		},
	}
	return cmd
}

// Discover asks every nexus service for its identity and collects the answers until quiet
// passes with no new one, or all expected services answered.
func Discover(ctx context.Context, nc *nats.Conn, quiet time.Duration) ([]ServiceStatus, error) {
	return discover(ctx, nc, quiet, len(Expected))
}

// discover is Discover stopping after want services (0: only when quiet passes).
func discover(ctx context.Context, nc *nats.Conn, quiet time.Duration, want int) ([]ServiceStatus, error) {
	infos, err := bus.Discover(ctx, nc, quiet, want)
	if err != nil {
		return nil, err
	}
	seen := map[string]ServiceStatus{}
	for _, info := range infos {
		name, _ := trimPrefix(info.Name, bus.ServicePrefix)
		st := ServiceStatus{Service: name, Up: true, Version: info.Version, Host: info.Metadata[bus.MetaHost], ID: info.ID}
		if t, err := time.Parse(time.RFC3339Nano, info.Metadata[bus.MetaStarted]); err == nil {
			st.Started = t
			st.Uptime = time.Since(t).Round(time.Second).String()
		}
		st.PID, _ = strconv.Atoi(info.Metadata[bus.MetaPID])
		seen[name] = st
	}
	return values(seen), nil
}

func trimPrefix(s, p string) (string, bool) {
	if len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return s, false
}

func values(m map[string]ServiceStatus) []ServiceStatus {
	out := make([]ServiceStatus, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// withMissing adds a down row for every expected service that did not answer, in a fixed order.
func withMissing(rows []ServiceStatus) []ServiceStatus {
	by := map[string]ServiceStatus{}
	for _, r := range rows {
		by[r.Service] = r
	}
	var out []ServiceStatus
	for _, name := range Expected {
		r, ok := by[name]
		if !ok {
			r = ServiceStatus{Service: name}
		}
		out = append(out, r)
		delete(by, name)
	}
	extra := values(by)
	sort.Slice(extra, func(i, j int) bool { return extra[i].Service < extra[j].Service })
	return append(out, extra...)
}

func printStatus(w io.Writer, rows []ServiceStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tSTATUS\tVERSION\tUPTIME\tHOST\tPID")
	for _, r := range rows {
		state := "down"
		if r.Up {
			state = "up"
		}
		pid := ""
		if r.PID != 0 {
			pid = strconv.Itoa(r.PID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Service, state, dash(r.Version), dash(r.Uptime), dash(r.Host), dash(pid))
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
