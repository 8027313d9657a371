package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

func logsCommand() *cobra.Command {
	var follow, agent bool
	var tail int
	var since string
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print a sandbox's console log (kernel, init and agent); -f follows it",
		Long: `Print a sandbox's console log: what the kernel, the guest's init and the guest agent
wrote on its serial console since its last boot (the agent's lines are there too, so a boot that
failed before the agent answered can be read). --agent prints instead the guest agent's own log,
kept in the guest's memory and read from the agent while it answers.

--tail N keeps the last N lines; --since keeps the lines newer than a duration (10m) or a time
(RFC 3339). A line's time is the kernel's since the sandbox started, or the agent's clock; a line
with neither has the time of the line before. Written to something other than a terminal (a file,
a pipe), the log has no ANSI escape codes and no carriage returns.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			lf := logFilter{tail: tail, out: cmd.OutOrStdout(), clean: !isTerminal(cmd.OutOrStdout())}
			if jsonOutput(cmd) {
				lf.json = true
				lf.name, _ = api.ParseName(args[0])
				lf.stream = map[bool]string{true: "agent", false: "console"}[agent]
			}
			if since != "" {
				if lf.since, err = parseSince(since, time.Now()); err != nil {
					return err
				}
			}
			if since != "" || lf.json {
				sb, err := c.Get(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				lf.started = sb.StartedAt
			}
			var off int64
			wait := 100 * time.Millisecond
			caughtUp := false
			for {
				resp, err := c.Logs(cmd.Context(), api.LogsRequest{Name: args[0], Offset: off, Agent: agent})
				if err != nil {
					return err
				}
				lf.write(resp.Data)
				if agent || len(resp.Data) == 0 {
					if !caughtUp {
						caughtUp = true
						lf.caughtUp()
					}
					if agent || !follow {
						lf.end()
						return nil
					}
					select {
					case <-cmd.Context().Done():
						lf.end()
						return nil
					case <-time.After(wait):
					}
					wait = min(2*wait, time.Second)
				} else {
					wait = 100 * time.Millisecond
				}
				off = resp.NextOffset
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output")
	cmd.Flags().BoolVar(&agent, "agent", false, "print the guest agent's own log instead of the console")
	cmd.Flags().IntVarP(&tail, "tail", "n", -1, "print only the last N lines (then follow with -f)")
	cmd.Flags().StringVar(&since, "since", "", "only lines newer than a duration (10m) or an RFC 3339 time")
	return cmd
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// parseSince reads --since: a duration back from now, or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, usageError{fmt.Errorf("invalid --since %q: use a duration (10m, 2h) or an RFC 3339 time (2026-08-07T10:00:00Z)", s)}
}

// LogLine is one line of `nexus logs --json` (JSON lines).
type LogLine struct {
	Sandbox string    `json:"sandbox"`
	Stream  string    `json:"stream"` // console or agent
	Time    time.Time `json:"time,omitzero"`
	Line    string    `json:"line"`
}

// logFilter cuts a log into lines and prints those that pass --since and --tail.
type logFilter struct {
	out     io.Writer
	tail    int // -1: every line
	since   time.Time
	started time.Time
	clean   bool // no ANSI codes nor carriage returns (not a terminal)
	json    bool
	name    string
	stream  string

	partial []byte
	last    time.Time // the time of the last line that had one
	held    [][]byte  // the last tail lines, until caught up
	live    bool      // caught up: lines print as they come
}

var (
	// ansi matches CSI and OSC escape sequences and other two-byte escapes.
	ansi       = regexp.MustCompile(`\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])`)
	kernelTime = regexp.MustCompile(`^\[\s*(\d+)\.(\d+)\]`)
	agentTime  = regexp.MustCompile(`^(\d\d):(\d\d):(\d\d)\.(\d{3}) `)
)

func (l *logFilter) write(b []byte) {
	data := append(l.partial, b...)
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		l.line(data[:i+1])
		data = data[i+1:]
	}
	l.partial = append([]byte(nil), data...)
}

// caughtUp prints the held tail lines: what follows prints as it comes.
func (l *logFilter) caughtUp() {
	for _, h := range l.held {
		l.print(h)
	}
	l.held, l.live = nil, true
}

// end prints a last line that has no newline yet.
func (l *logFilter) end() {
	if len(l.partial) > 0 {
		l.line(l.partial)
		l.partial = nil
	}
	if !l.live {
		l.caughtUp()
	}
}

func (l *logFilter) line(b []byte) {
	if l.clean {
		b = ansi.ReplaceAll(b, nil)
		b = bytes.ReplaceAll(b, []byte("\r"), nil)
	}
	if t := l.lineTime(b); !t.IsZero() {
		l.last = t
	}
	if !l.since.IsZero() && (l.last.IsZero() || l.last.Before(l.since)) {
		return
	}
	if l.live || l.tail < 0 {
		l.print(b)
		return
	}
	if l.tail == 0 {
		return
	}
	if len(l.held) == l.tail {
		l.held = l.held[1:]
	}
	l.held = append(l.held, append([]byte(nil), b...))
}

func (l *logFilter) print(b []byte) {
	if !l.json {
		l.out.Write(b)
		return
	}
	printJSONLine(l.out, LogLine{Sandbox: l.name, Stream: l.stream, Time: l.last, Line: string(bytes.TrimRight(b, "\r\n"))})
}

// lineTime is when a line was written, if it says: the kernel's seconds since boot, or the
// agent's clock (UTC) on the day the sandbox started.
func (l *logFilter) lineTime(b []byte) time.Time {
	if l.started.IsZero() {
		return time.Time{}
	}
	if m := kernelTime.FindSubmatch(b); m != nil {
		s, _ := strconv.ParseInt(string(m[1]), 10, 64)
		frac, _ := strconv.ParseFloat("0."+string(m[2]), 64)
		return l.started.Add(time.Duration(s)*time.Second + time.Duration(frac*float64(time.Second)))
	}
	if m := agentTime.FindSubmatch(b); m != nil {
		h, _ := strconv.Atoi(string(m[1]))
		mi, _ := strconv.Atoi(string(m[2]))
		s, _ := strconv.Atoi(string(m[3]))
		ms, _ := strconv.Atoi(string(m[4]))
		d := l.started.UTC()
		t := time.Date(d.Year(), d.Month(), d.Day(), h, mi, s, ms*int(time.Millisecond), time.UTC)
		if t.Before(l.started.Add(-time.Hour)) {
			t = t.Add(24 * time.Hour) // past midnight since the start
		}
		return t
	}
	return time.Time{}
}
