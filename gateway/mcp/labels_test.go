package mcp

import (
	"strings"
	"testing"
)

// Label keys and values reach the gateway as given: a key holding '=' is refused, not split
// into another key and value, and so is a value that would break `ps` (issue 18).
func TestLabelsAreValidatedNotRewritten(t *testing.T) {
	st := newStack(t, false)
	for _, labels := range []map[string]string{{"a=b": "c"}, {"task": "x\ny"}, {"": "v"}} {
		msg, _ := st.fails(t, "sandbox_create", map[string]any{"start": true, "name": "lbl", "image": "nexus-mini", "labels": labels})
		if !strings.Contains(msg, "invalid label") {
			t.Errorf("labels %q: %s", labels, msg)
		}
		msg, _ = st.fails(t, "sandbox_fork", map[string]any{"snapshot": "nosuch", "name": "lbl2", "labels": labels})
		if !strings.Contains(msg, "invalid label") {
			t.Errorf("fork with labels %q: %s", labels, msg)
		}
	}
}
