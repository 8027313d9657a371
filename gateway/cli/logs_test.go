package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const console = "\x1b[0m[    0.100000] Linux version 6.1\r\n" +
	"[    2.000000] \x1b[32mnexus-agent\x1b[0m: listening\r\n" +
	"plain line\r\n" +
	"[   65.500000] late kernel line\r\n" +
	"12:01:10.000 INF exec started\r\n" +
	"partial"

// TestLogFilter: --tail keeps the last lines, --since the newer ones by the kernel's clock (and
// the agent's), and a log that is not written to a terminal has no ANSI codes nor \r.
func TestLogFilter(t *testing.T) {
	started := time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC)
	run := func(lf logFilter, chunks ...string) string {
		var out bytes.Buffer
		lf.out = &out
		for _, c := range chunks {
			lf.write([]byte(c))
		}
		lf.end()
		return out.String()
	}
	// Cut anywhere, the same lines come out.
	half := len(console) / 2
	if got := run(logFilter{tail: -1, clean: true}, console[:half], console[half:]); got != "[    0.100000] Linux version 6.1\n[    2.000000] nexus-agent: listening\nplain line\n[   65.500000] late kernel line\n12:01:10.000 INF exec started\npartial" {
		t.Errorf("clean: %q", got)
	}
	if got := run(logFilter{tail: -1}, console); got != console {
		t.Errorf("to a terminal the log is as written: %q", got)
	}
	if got := run(logFilter{tail: 2, clean: true}, console); got != "12:01:10.000 INF exec started\npartial" {
		t.Errorf("--tail 2: %q", got)
	}
	if got := run(logFilter{tail: 0, clean: true}, console); got != "" {
		t.Errorf("--tail 0: %q", got)
	}
	// --since 12:01:00: the kernel line at 65.5 s, the agent's at 12:01:10, and the partial line
	// after it (it has the time of the line before).
	since := started.Add(time.Minute)
	if got := run(logFilter{tail: -1, clean: true, since: since, started: started}, console); got != "[   65.500000] late kernel line\n12:01:10.000 INF exec started\npartial" {
		t.Errorf("--since: %q", got)
	}
	out := run(logFilter{tail: 1, clean: true, json: true, name: "demo/t1", stream: "console", started: started}, console)
	var l LogLine
	if err := json.Unmarshal([]byte(out), &l); err != nil || l.Line != "partial" || l.Sandbox != "demo/t1" || !l.Time.Equal(started.Add(70*time.Second)) {
		t.Errorf("--json: %q (%v)", out, err)
	}
	if _, err := parseSince("yesterday", started); err == nil || !strings.Contains(err.Error(), "invalid --since") {
		t.Errorf("--since yesterday: %v", err)
	}
	if got, _ := parseSince("10m", started); !got.Equal(started.Add(-10 * time.Minute)) {
		t.Errorf("--since 10m: %v", got)
	}
}
