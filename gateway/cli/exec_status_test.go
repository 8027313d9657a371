package cli

import (
	"bytes"
	"testing"
)

// code runs one nexus command against the stack the way main does and returns its exit status.
func (st *gatewayStack) code(t *testing.T, args ...string) int {
	t.Helper()
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--home", string(st.bus.Home), "--bus-url", st.bus.URL, "--log-level", "error"}, args...))
	return Execute(root)
}

// Every failure of nexus itself makes exec and attach exit 125, never a status the guest
// command could have returned (issue 18).
func TestExecFailuresExit125(t *testing.T) {
	st := newGatewayStack(t)
	st.must(t, "create", "box", "--image", "nexus-mini")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"missing sandbox", []string{"exec", "nosuch", "--", "true"}},
		{"the vmm refuses", []string{"exec", "box", "--", "true"}},
		{"bad flag", []string{"exec", "--no-such-flag", "box", "--", "true"}},
		{"no command", []string{"exec", "box"}},
		{"bad -e", []string{"exec", "-e", "NOEQUALS", "box", "--", "true"}},
		{"attach missing sandbox", []string{"attach", "nosuch"}},
		{"attach bad args", []string{"attach"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code := st.code(t, tc.args...); code != ExitExecFailed {
				t.Fatalf("nexus %v exited %d, want %d", tc.args, code, ExitExecFailed)
			}
		})
	}
	// Other commands keep their statuses.
	if code := st.code(t, "start", "--no-such-flag"); code != 2 {
		t.Fatalf("a bad flag of start exited %d, want 2", code)
	}
	if code := st.code(t, "rm", "nosuch"); code != 1 {
		t.Fatalf("rm of a missing sandbox exited %d, want 1", code)
	}
}
