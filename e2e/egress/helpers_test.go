package egress_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
)

// create boots a sandbox labelled for cleanup and removes it when t ends.
func create(t *testing.T, name, image string, args ...string) {
	t.Helper()
	mem := "256"
	if image == "nexus-base" {
		// Cold: the package's one nexus-base create would leave a 512 MiB nexus-base template
		// building in the background, a second boot that no later create restores.
		mem = "512"
		args = append([]string{"--cold"}, args...)
	}
	start := time.Now()
	stack.MustNexus(t, append([]string{"create", name, "--image", image, "--memory", mem, "-l", "nexus-test=1"}, args...)...)
	t.Logf("created %s (%s) in %.1fs", name, image, time.Since(start).Seconds())
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", name) })
}

// sh runs a shell script in the guest.
func sh(t *testing.T, name, script string) (string, string, int) {
	t.Helper()
	return stack.Nexus(t, "exec", name, "--", "sh", "-c", script)
}

// mustSh runs a script that must succeed and returns its stdout.
func mustSh(t *testing.T, name, script string) string {
	t.Helper()
	out, errOut, code := sh(t, name, script)
	if code != 0 {
		t.Fatalf("guest %s: %q: exit %d\nstdout: %s\nstderr: %s", name, script, code, out, errOut)
	}
	return out
}

// events reads the sandbox's audit events (all, or only denials) with the CLI.
func events(t *testing.T, name string, denied bool) []audit.Event {
	t.Helper()
	args := []string{"audit", "tail", "--sandbox", name, "--json"}
	if denied {
		args = append(args, "--denied")
	}
	out := stack.MustNexus(t, args...)
	var evs []audit.Event
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var ev audit.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("audit tail --json: %v: %q", err, line)
		}
		evs = append(evs, ev)
	}
	return evs
}

// waitEvent polls the audit stream until an event matching match arrives (publishing is
// asynchronous) and returns it.
func waitEvent(t *testing.T, name string, denied bool, what string, match func(audit.Event) bool) audit.Event {
	t.Helper()
	var found audit.Event
	err := testutil.Poll(15*time.Second, func() error {
		for _, ev := range events(t, name, denied) {
			if match(ev) {
				found = ev
				return nil
			}
		}
		return fmt.Errorf("no audit event: %s", what)
	})
	if err != nil {
		evs := events(t, name, false)
		var b strings.Builder
		for _, ev := range evs {
			j, _ := json.Marshal(ev)
			b.WriteString("  " + string(j) + "\n")
		}
		t.Fatalf("%v; the sandbox's events:\n%s", err, b.String())
	}
	return found
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// guestEnv returns the guest's environment as the exec sees it.
func guestEnv(t *testing.T, name string) map[string]string {
	t.Helper()
	out := mustSh(t, name, "env")
	env := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	return env
}

// sandboxID returns the id of a sandbox by name.
func sandboxID(t *testing.T, name string) string {
	t.Helper()
	out := stack.MustNexus(t, "ps", "-a", "--json")
	var list []struct{ ID, Name string }
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v", err)
	}
	for _, s := range list {
		if s.Name == name {
			return s.ID
		}
	}
	t.Fatalf("no sandbox %s", name)
	return ""
}

// installProbe copies the probe tool (testdata/probe) into the guest as /usr/local/bin/probe.
func installProbe(t *testing.T, name string) {
	t.Helper()
	stack.MustNexus(t, "cp", probeBin, name+":/usr/local/bin/probe")
}
