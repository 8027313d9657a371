package cli

import (
	"strings"
	"testing"
)

// TestCompletion: names are completed from the running stack (sandboxes, with their project),
// profiles from the registry; `nexus completion bash` prints a script.
func TestCompletion(t *testing.T) {
	st := newGatewayStack(t)
	st.must(t, "create", "demo/t1", "--image", "nexus-mini")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"rm", ""}, []string{"demo/t1"}},
		{[]string{"exec", "de"}, []string{"demo/t1"}},
		{[]string{"logs", "demo/t1", ""}, nil},
		{[]string{"cp", "demo"}, []string{"demo/t1:/"}},
		{[]string{"create", "x", "--agent", ""}, []string{"claude-code", "codex"}},
		{[]string{"image", "build", ""}, []string{"nexus-base", "nexus-mini"}},
	} {
		out, errOut, code := st.exec(t, append([]string{"__complete"}, tc.args...)...)
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if l != "" && !strings.HasPrefix(l, ":") && !strings.HasPrefix(l, "Completion ended") {
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
		}
		if code != 0 || strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("complete %q: exit %d, got %q, want %q (%s)", tc.args, code, got, tc.want, errOut)
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if out, _, code := st.exec(t, "completion", shell); code != 0 || !strings.Contains(out, "nexus") {
			t.Errorf("completion %s: exit %d, %.60q", shell, code, out)
		}
	}
}
