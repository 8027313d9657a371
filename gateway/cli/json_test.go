package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// runnable is every command of the tree that runs something, by its path after "nexus".
func runnable(root *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && !c.Hidden && c.Name() != "help" && (c.Parent() == nil || c.Parent().Name() != "completion") {
			out = append(out, c)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return out
}

func cmdPath(c *cobra.Command) string { return strings.TrimPrefix(c.CommandPath(), "nexus ") }

// jsonArgs are the arguments each command runs with under --json in TestEveryCommandJSON; a
// new command must be added here (or to jsonRefused) to keep --json true for all of them.
func jsonArgs(t *testing.T) map[string][]string {
	tmp := t.TempDir()
	return map[string][]string{
		"agent ls":          nil,
		"audit tail":        nil,
		"config check":      {tmp + "/none.yaml"},
		"cp":                {"box:/etc/hostname", tmp},
		"create":            {"made", "--image", "nexus-mini"},
		"delegate create":   {tmp},
		"delegate dispatch": {"box", "--brief", "hi"},
		"delegate poll":     {"box"},
		"delegate teardown": {"nosuch"},
		"down":              nil,
		"egress explain":    {"box", "GET", "https://example.com/"},
		"egress show":       {"box"},
		"egress allow":      {"box", "example.com"},
		"egress revoke":     {"box", "example.com"},
		"egress deny":       {"box", "example.com"},
		"egress apply":      {"box", "--config", tmp + "/none.yaml"},
		"egress requests":   nil,
		"egress approve":    {"r-nosuch"},
		"egress reject":     {"r-nosuch"},
		"exec":              {"box", "true"},
		"fork":              {"nosnap", "forked"},
		"image build":       {"nexus-bogus"},
		"image ls":          nil,
		"image pull":        {"127.0.0.1:1/nothing/here:1"}, // loopback, nothing listens
		"image import":      {tmp + "/missing.tar"},
		"image save":        {"nexus-bogus", "-o", tmp + "/out.tar"},
		"image inspect":     {"nexus-bogus"},
		"image rm":          {"nexus-bogus"},
		"image warm":        {"nexus-bogus"},
		"logs":              {"box"},
		"pause":             {"box"},
		"ports":             nil,
		"ps":                nil,
		"resume":            {"box"},
		"rm":                {"-l", "nomatch=1"},
		"sandbox create":    {"made2", "--image", "nexus-mini"},
		"secret ls":         nil,
		"secret rm":         {"NOPE"},
		"secret set":        {"NOPE", "--from-env", "NEXUS_TEST_UNSET_VAR"},
		"snapshot create":   {"box", "snap"},
		"snapshot ls":       nil,
		"snapshot rm":       {"snap"},
		"start":             {"box"},
		"stats":             nil,
		"status":            nil,
		"stop":              {"nosuch"},
		"version":           nil,
		"token create":      {"cli-test"},
		"token ls":          nil,
		"token revoke":      {"nosuch"},
		"volume ls":         nil,
		"volume rm":         {"box", "vol"},

		// issue 25: this host's cluster membership
		"cluster init":         {"--host", "local"},
		"cluster join":         {"bogus"},
		"cluster token create": nil,
		"cluster token ls":     nil,
		"cluster token revoke": {"nosuch"},
		"cluster migrate":      nil, // this home is in no cluster: a JSON usage error
		"hosts":                nil,
		"hosts drain":          {"b"},
		"hosts undrain":        {"b"},
	}
}

// jsonRefused are the interactive commands: under --json they fail with a sentence saying so.
var jsonRefused = map[string][]string{
	"attach":       {"box"},
	"agent launch": {"nexus-mini", "/bin/sh"},
	"herdr launch": {"nexus-mini", "/bin/sh"},
	"mcp":          nil,
	"nats":         nil, // the NATS CLI's own --json comes after its command
}

// TestEveryCommandJSON walks the whole command tree: every runnable command, run with --json,
// prints only JSON on stdout and, when it fails, a JSON error {"error":{"code","message"}} on
// stderr; the interactive ones refuse --json with a clear sentence.
func TestEveryCommandJSON(t *testing.T) {
	st := newGatewayStack(t)
	st.must(t, "create", "box", "--image", "nexus-mini")
	args := jsonArgs(t)
	root := NewRoot()
	for _, c := range runnable(root) {
		p := cmdPath(c)
		a, ok := byPath(args, root, c)
		refusedArgs, refused := jsonRefused[p]
		if !ok && !refused {
			t.Errorf("nexus %s: not in jsonArgs nor jsonRefused: say how it runs under --json", p)
			continue
		}
		if refused {
			a = refusedArgs
		}
		out, errOut, code := st.exec(t, append(append(strings.Fields(p), "--json"), a...)...)
		if refused {
			var e ErrorJSON
			if code == 0 || json.Unmarshal([]byte(lastLine(errOut)), &e) != nil || !strings.Contains(e.Error.Message, "--json") || out != "" {
				t.Errorf("nexus %s --json: exit %d, stdout %q, stderr %q: want a JSON refusal", p, code, out, errOut)
			}
			continue
		}
		if !jsonLines(out) {
			t.Errorf("nexus %s --json: stdout is not JSON: %q", p, out)
		}
		if code != 0 && out == "" {
			var e ErrorJSON
			if err := json.Unmarshal([]byte(lastLine(errOut)), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Errorf("nexus %s --json: exit %d and stderr %q: want a JSON error", p, code, errOut)
			}
		}
	}
}

// jsonLines reports whether s is empty, one JSON value, or one JSON value per line.
func jsonLines(s string) bool {
	if strings.TrimSpace(s) == "" || json.Valid([]byte(s)) {
		return true
	}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if !json.Valid(sc.Bytes()) {
			return false
		}
	}
	return true
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// exec runs one nexus command through Execute, as main does: exit code, stdout and stderr.
func (st *gatewayStack) exec(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	root := NewRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(""))
	root.SetArgs(append([]string{"--home", string(st.bus.Home), "--bus-url", st.bus.URL, "--log-level", "error"}, args...))
	code := Execute(root)
	return out.String(), errOut.String(), code
}

// TestJSONAgreesWithText: rm --json says what the text says (removed), with project/name;
// a selector that matches nothing says so; errors are JSON on stderr with their code.
func TestJSONAgreesWithText(t *testing.T) {
	st := newGatewayStack(t)
	st.must(t, "create", "box", "--image", "nexus-mini")
	st.must(t, "create", "box2", "--image", "nexus-mini")
	out, _, code := st.exec(t, "rm", "--force", "--json", "box")
	var res []api.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 || len(res) != 1 || res[0].Name != "default/box" || res[0].State != "removed" {
		t.Errorf("rm --json: exit %d %s (%v)", code, out, err)
	}
	if out, _, _ := st.exec(t, "rm", "--force", "box2"); out != "default/box2 removed\n" {
		t.Errorf("rm: %q", out)
	}
	_, errOut, code := st.exec(t, "rm", "-l", "nomatch=1")
	if code != 0 || !strings.Contains(errOut, "no sandbox matched -l nomatch=1") {
		t.Errorf("rm -l nomatch=1: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = st.exec(t, "--json", "egress", "show", "nosuch")
	var e ErrorJSON
	if err := json.Unmarshal([]byte(errOut), &e); err != nil || code != 1 || e.Error.Code != "not_found" || !strings.Contains(e.Error.Message, "default/nosuch") ||
		strings.HasPrefix(e.Error.Message, "nexus:") {
		t.Errorf("egress show nosuch --json: exit %d, stderr %q", code, errOut)
	}
	// A usage error is JSON too, code invalid, exit 2, without the text hint.
	_, errOut, code = st.exec(t, "ps", "--json", "--no-such-flag")
	if err := json.Unmarshal([]byte(errOut), &e); err != nil || code != 2 || e.Error.Code != "invalid" {
		t.Errorf("ps --json --no-such-flag: exit %d, stderr %q", code, errOut)
	}
}

// TestEveryCommandHasExamples: the help of every runnable command has an Examples: section.
func TestEveryCommandHasExamples(t *testing.T) {
	for _, c := range runnable(NewRoot()) {
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("nexus %s: no Examples: in its help", cmdPath(c))
		}
	}
}
