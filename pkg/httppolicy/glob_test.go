package httppolicy

import (
	"strings"
	"testing"
	"time"
)

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pat, name string
		want      bool
	}{
		{"/v1/**", "/v1/a", true},
		{"/v1/**", "/v1/a/b/c", true},
		{"/v1/**", "/v1/", true},
		{"/v1/**", "/v1", false},
		{"/v1/**", "/v2/a", false},
		{"/v1/*", "/v1/a", true},
		{"/v1/*", "/v1/a/b", false},
		{"/v1/*.json", "/v1/x.json", true},
		{"/v1/*.json", "/v1/x.jsonx", false},
		{"/a/**/z", "/a/z", true},
		{"/a/**/z", "/a/b/c/z", true},
		{"/a/**/z", "/a/b/c/y", false},
		{"/", "/", true},
		{"/", "/x", false},
		{"/x", "/X", false},
		{"refs/heads/nexus/**", "refs/heads/nexus/feature", true},
		{"refs/heads/nexus/**", "refs/heads/nexus", false},
		{"refs/heads/nexus/**", "refs/heads/nexusx/a", false},
		{"refs/heads/*", "refs/heads/main", true},
		{"/a*b*c", "/abxbc", true},
		{"/a*b*c", "/abxbd", false},
	} {
		g, err := ParseGlob(tc.pat)
		if err != nil {
			t.Fatalf("%s: %v", tc.pat, err)
		}
		if got := g.Match(tc.name); got != tc.want {
			t.Errorf("%q.Match(%q) = %v, want %v", tc.pat, tc.name, got, tc.want)
		}
	}
}

func TestParseGlobRefuses(t *testing.T) {
	for _, p := range []string{"", "/a/**b", "/a/***", "/a?", "/[ab]", "/{a,b}", "/a//b", "/a/../b", "/a b", "/a\\b", "/é"} {
		if _, err := ParseGlob(p); err == nil {
			t.Errorf("ParseGlob(%q) accepted", p)
		}
	}
}

func TestParsePathRule(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		want string
	}{
		{"GET /v1/**", true, "GET /v1/**"},
		{"post  /x", true, "POST /x"},
		{"* /health", true, "* /health"},
		{"GET", false, ""},
		{"GET v1/**", false, ""},
		{"BREW /pot", false, ""},
		{"GET /a /b", false, ""},
		{"GET /a/**x", false, ""},
	} {
		r, err := ParsePathRule(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParsePathRule(%q) err=%v", tc.in, err)
			continue
		}
		if tc.ok && r.String() != tc.want {
			t.Errorf("ParsePathRule(%q) = %q", tc.in, r)
		}
	}
}

func FuzzGlobMatch(f *testing.F) {
	f.Add("/v1/**", "/v1/a/b")
	f.Add("/a*b*c*d*e", "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
	f.Add("/**/**/**/x", "/a/b/c/d/e/f/g/h/i/j")
	f.Fuzz(func(t *testing.T, pat, name string) {
		g, err := ParseGlob(pat)
		if err != nil {
			return
		}
		got := g.Match(name)
		if len(pat) <= 16 && len(name) <= 24 {
			if want := naiveMatch(strings.Split(pat, "/"), strings.Split(name, "/")); got != want {
				t.Fatalf("%q.Match(%q) = %v, naive %v", pat, name, got, want)
			}
		}
		if !g.Match(pat) && !containsWild(pat) {
			t.Fatalf("literal pattern %q does not match itself", pat)
		}
	})
}

func containsWild(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '*' {
			return true
		}
	}
	return false
}

func TestGlobManyStars(t *testing.T) {
	g := MustGlob("/" + strings.Repeat("**/", 100) + "x")
	name := "/" + strings.Repeat("a/", 2000) + "y"
	start := time.Now()
	if g.Match(name) {
		t.Fatal("matched")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("match took %v", d)
	}
	if !g.Match("/" + strings.Repeat("a/", 200) + "x") {
		t.Fatal("no match")
	}
}

// naiveMatch is the reference semantics: ** at the end is one or more segments, elsewhere zero
// or more; * is any run within a segment.
func naiveMatch(pat, name []string) bool {
	if len(pat) == 0 {
		return len(name) == 0
	}
	if pat[0] == "**" {
		min := 0
		if len(pat) == 1 {
			min = 1
		}
		for k := min; k <= len(name); k++ {
			if naiveMatch(pat[1:], name[k:]) {
				return true
			}
		}
		return false
	}
	return len(name) > 0 && naiveSeg(pat[0], name[0]) && naiveMatch(pat[1:], name[1:])
}

func naiveSeg(p, s string) bool {
	if p == "" {
		return s == ""
	}
	if p[0] == '*' {
		for k := 0; k <= len(s); k++ {
			if naiveSeg(p[1:], s[k:]) {
				return true
			}
		}
		return false
	}
	return s != "" && p[0] == s[0] && naiveSeg(p[1:], s[1:])
}

func TestParseBranch(t *testing.T) {
	for _, tc := range []struct {
		pat, ref string
		ok, want bool
	}{
		{"refs/heads/nexus/**", "refs/heads/nexus/a", true, true},
		{"refs/heads/fix#12", "refs/heads/fix#12", true, true},
		{"refs/heads/{x}", "refs/heads/{x}", true, true},
		{"heads/x", "", false, false},
		{"refs/heads/a?", "", false, false},
		{"refs/heads/[ab]", "", false, false},
	} {
		g, err := ParseBranch(tc.pat)
		if (err == nil) != tc.ok {
			t.Errorf("ParseBranch(%q): %v", tc.pat, err)
			continue
		}
		if tc.ok && g.Match(tc.ref) != tc.want {
			t.Errorf("%q.Match(%q) != %v", tc.pat, tc.ref, tc.want)
		}
	}
}
