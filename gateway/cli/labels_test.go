package cli

import (
	"strings"
	"testing"
)

// A label value with a newline is refused at create; a value with a comma is listed by ps as
// a selector that -l matches (issue 18).
func TestLabelValuesAndSelectors(t *testing.T) {
	st := newGatewayStack(t)
	if code := st.code(t, "create", "bad", "--image", "nexus-mini", "-l", "task=a\nb"); code != 2 {
		t.Fatalf("a label value with a newline: exit %d, want 2", code)
	}
	if out := st.must(t, "ps", "-a"); strings.Contains(out, "bad") {
		t.Fatalf("the refused sandbox is listed:\n%s", out)
	}
	st.must(t, "create", "box", "--image", "nexus-mini", "-l", "a=x,y")
	st.must(t, "create", "other", "--image", "nexus-mini", "-l", "a=x")
	out := st.must(t, "ps", "-l", `a=x\,y`)
	if !strings.Contains(out, "box") || strings.Contains(out, "other") || !strings.Contains(out, `a=x\,y`) {
		t.Fatalf(`ps -l 'a=x\,y':`+"\n%s", out)
	}
}
