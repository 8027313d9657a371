package cli

import (
	"strings"
	"testing"
)

// TestNearMisses: the errors a user meets first say what to do instead.
func TestNearMisses(t *testing.T) {
	st := newGatewayStack(t)
	st.must(t, "create", "demo/t1", "--image", "nexus-mini")
	if _, errOut, code := st.exec(t, "exec", "t1", "true"); code != ExitExecFailed || !strings.Contains(errOut, "no sandbox named default/t1; did you mean demo/t1?") {
		t.Errorf("exec t1: exit %d, stderr %q", code, errOut)
	}
	st.must(t, "pause", "demo/t1")
	if _, errOut, code := st.exec(t, "exec", "demo/t1", "true"); code != ExitExecFailed || !strings.Contains(errOut, "is paused: resume it with `nexus resume demo/t1`") {
		t.Errorf("exec on a paused sandbox: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := st.exec(t, "create", "x", "--egress", "none", "--allow-host", "example.com"); code != 2 || !strings.Contains(errOut, "--egress none contradicts --allow-host") {
		t.Errorf("create --egress none --allow-host: exit %d, stderr %q", code, errOut)
	}
	if out := st.must(t, "ps"); !strings.Contains(out, "MEMORY (RSS/LIMIT)") {
		t.Errorf("ps: %q", out)
	}
}
