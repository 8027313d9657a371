package gateway

import (
	"errors"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// A label value that would break a line of `ps` is refused with one line (issue 18).
func TestLabelValuesAreRefused(t *testing.T) {
	for _, v := range []string{"x\ny", "x\ry", "tab\there", "nul\x00", "del\x7f", "c1\u0085", "rtl\u202eoverride",
		" lead", "trail ", "bad utf8 \xff", strings.Repeat("v", MaxLabelValue+1)} {
		_, err := ParseLabels([]string{"k=" + v})
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("label value %q accepted (%v)", v, err)
			continue
		}
		if strings.ContainsAny(err.Error(), "\n\r\x00\x7f") || strings.Contains(err.Error(), "\u202e") {
			t.Errorf("the error for %q is not one clean line: %q", v, err)
		}
		if ValidateLabels(map[string]string{"k": v}) == nil {
			t.Errorf("ValidateLabels accepted %q", v)
		}
	}
	for _, k := range []string{"a=b", "", "-lead", "sp ace", "k\n", strings.Repeat("k", 64)} {
		if ValidateLabels(map[string]string{k: "v"}) == nil {
			t.Errorf("label key %q accepted", k)
		}
	}
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[strings.Repeat("k", i%60+1)+string(rune('a'+i/60))] = "v"
	}
	if ValidateLabels(many) == nil {
		t.Errorf("%d labels accepted", len(many))
	}
}

// Every value a label may hold can be selected with -l (issue 18: `a=x,y` could not be), and
// what ps shows of labels is itself a selector that matches them.
func TestEveryAcceptedValueCanBeSelected(t *testing.T) {
	for _, v := range []string{"x,y", `back\slash`, "a=b", "x!=y", "feature/x", "héllo wörld", ",", `\`, `\,`, "", "42"} {
		labels, err := ParseLabels([]string{"k=" + v, "other=1"})
		if err != nil {
			t.Fatalf("value %q refused: %v", v, err)
		}
		shown := FormatLabels(labels)
		for _, expr := range []string{shown, "k=" + escapeValue(v), "other=1,k=" + escapeValue(v)} {
			sel, err := ParseSelector(expr)
			if err != nil {
				t.Fatalf("selector %q for value %q: %v", expr, v, err)
			}
			if !sel.Matches(labels) {
				t.Errorf("selector %q does not match k=%q", expr, v)
			}
			if sel.Matches(map[string]string{"k": v + "z", "other": "1"}) {
				t.Errorf("selector %q matches k=%q", expr, v+"z")
			}
		}
		sel, err := ParseSelector("k!=" + escapeValue(v))
		if err != nil || sel.Matches(labels) {
			t.Errorf("k!=%q matches k=%q (%v)", escapeValue(v), v, err)
		}
	}
	if _, err := ParseSelector(`k=x\`); err == nil {
		t.Error("a selector ending with a lone backslash was accepted")
	}
	sel, err := ParseSelector("a=x,y")
	if err != nil || len(sel) != 2 {
		t.Fatalf("a=x,y is two terms (a=x and y present): %v %v", sel, err)
	}
}

func FuzzSelectorMatchesItsLabel(f *testing.F) {
	for _, v := range []string{"x,y", `a\b`, "a=b", "x!=y", "", " "} {
		f.Add("k", v)
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		if ValidateLabel(k, v) != nil {
			return
		}
		labels := map[string]string{k: v}
		sel, err := ParseSelector(FormatLabels(labels))
		if err != nil {
			t.Fatalf("ps shows %q, not a selector: %v", FormatLabels(labels), err)
		}
		if !sel.Matches(labels) || len(sel) != 1 {
			t.Fatalf("selector %q does not match {%q: %q}", FormatLabels(labels), k, v)
		}
	})
}
