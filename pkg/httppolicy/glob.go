package httppolicy

import (
	"fmt"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Glob is a '/'-separated pattern: "*" matches any run of characters within one segment, a
// segment "**" matches any number of whole segments (at the end of a pattern: one or more, so
// "/v1/**" covers everything below /v1 but not /v1 itself; elsewhere: zero or more). Every
// other character matches itself. Paths ("/v1/**") and ref names ("refs/heads/nexus/**") use it.
type Glob struct {
	src  string
	segs []string
}

// globForbidden are characters a glob may not contain: other glob dialects' syntax (so that a
// pattern never silently means something else), and what never appears in a canonical path.
const globForbidden = "?[]{}\\#"

// branchForbidden are the characters a branch pattern may not contain: those git forbids in ref
// names anyway ('#', '{' and '}' are legal in branch names and match themselves).
const branchForbidden = "?[\\"

// ParseGlob validates and compiles a pattern.
func ParseGlob(s string) (Glob, error) { return parseGlob(s, globForbidden) }

func parseGlob(s, forbidden string) (Glob, error) {
	if s == "" {
		return Glob{}, errdefs.Invalid("empty pattern")
	}
	if len(s) > 1024 {
		return Glob{}, errdefs.Invalid("pattern longer than 1024 bytes")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= 0x20 || c >= 0x7f {
			return Glob{}, errdefs.Invalid("pattern %q: only printable ASCII without spaces", clip(s))
		}
		if strings.IndexByte(forbidden, c) >= 0 {
			return Glob{}, errdefs.Invalid("pattern %q: %q is not supported (use * within a segment and ** for whole segments)", clip(s), c)
		}
	}
	segs := strings.Split(s, "/")
	for i, seg := range segs {
		switch {
		case seg == "." || seg == "..":
			return Glob{}, errdefs.Invalid("pattern %q: dot segments never match a canonical path", clip(s))
		case seg == "" && i > 0 && i < len(segs)-1:
			return Glob{}, errdefs.Invalid("pattern %q: empty segment (//)", clip(s))
		case seg == "**":
		case strings.Contains(seg, "**"):
			return Glob{}, errdefs.Invalid("pattern %q: ** must be a whole segment", clip(s))
		}
	}
	return Glob{src: s, segs: compileSegs(segs)}, nil
}

// MustGlob is ParseGlob for patterns known to be valid.
func MustGlob(s string) Glob {
	g, err := ParseGlob(s)
	if err != nil {
		panic(err)
	}
	return g
}

// String is the pattern as written.
func (g Glob) String() string { return g.src }

// Match reports whether name matches the pattern, in time linear in the product of the
// pattern's and the name's lengths however many ** the pattern holds.
func (g Glob) Match(name string) bool {
	if g.segs == nil {
		return false
	}
	return matchSegs(g.segs, strings.Split(name, "/"))
}

// compileSegs rewrites a pattern's segments for matchSegs: repeated ** collapse into one, and a
// trailing ** (one or more segments) becomes "*" (exactly one, possibly empty) followed by "**"
// (zero or more).
func compileSegs(segs []string) []string {
	var out []string
	for _, s := range segs {
		if s == "**" && len(out) > 0 && out[len(out)-1] == "**" {
			continue
		}
		out = append(out, s)
	}
	if n := len(out); n > 0 && out[n-1] == "**" {
		out = append(out[:n-1], "*", "**")
	}
	return out
}

// matchSegs is the classic greedy wildcard match over segments: "**" matches any run of
// segments, every other pattern segment exactly one; on a mismatch only the latest ** is
// widened.
func matchSegs(pat, name []string) bool {
	pi, ni := 0, 0
	star, mark := -1, 0
	for ni < len(name) {
		switch {
		case pi < len(pat) && pat[pi] == "**":
			star, mark = pi, ni
			pi++
		case pi < len(pat) && matchSeg(pat[pi], name[ni]):
			pi++
			ni++
		case star >= 0:
			pi = star + 1
			mark++
			ni = mark
		default:
			return false
		}
	}
	for pi < len(pat) && pat[pi] == "**" {
		pi++
	}
	return pi == len(pat)
}

// matchSeg matches one segment against a pattern with * wildcards (linear-time two-pointer).
func matchSeg(p, s string) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case pi < len(p) && p[pi] == s[si]:
			pi++
			si++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// Methods a paths rule may name; "*" is any.
var knownMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// PathRule is one `paths:` entry: "METHOD /glob" ("GET /v1/**", "* /healthz").
type PathRule struct {
	Method string // upper case, or "*"
	Path   Glob
}

// ParsePathRule parses "METHOD /glob".
func ParsePathRule(s string) (PathRule, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return PathRule{}, errdefs.Invalid("paths rule %q: want METHOD /path-glob, such as \"GET /v1/**\"", clip(s))
	}
	m := strings.ToUpper(f[0])
	if m != "*" && !contains(knownMethods, m) {
		return PathRule{}, errdefs.Invalid("paths rule %q: unknown method %q (use %s or *)", clip(s), clip(f[0]), strings.Join(knownMethods, ", "))
	}
	if !strings.HasPrefix(f[1], "/") {
		return PathRule{}, errdefs.Invalid("paths rule %q: the path must start with /", clip(s))
	}
	g, err := ParseGlob(f[1])
	if err != nil {
		return PathRule{}, errdefs.Invalid("paths rule %q: %v", clip(s), strings.TrimPrefix(err.Error(), "invalid: "))
	}
	return PathRule{Method: m, Path: g}, nil
}

// String renders the rule as "METHOD /glob".
func (r PathRule) String() string { return r.Method + " " + r.Path.String() }

// Match reports whether the rule covers method and a canonical path.
func (r PathRule) Match(method, path string) bool {
	return (r.Method == "*" || r.Method == method) && r.Path.Match(path)
}

// ParseBranch validates an allowed-branches pattern ("refs/heads/nexus/**").
func ParseBranch(s string) (Glob, error) {
	if !strings.HasPrefix(s, "refs/") {
		return Glob{}, errdefs.Invalid("branch pattern %q: must start with refs/", clip(s))
	}
	g, err := parseGlob(s, branchForbidden)
	if err != nil {
		return Glob{}, fmt.Errorf("branch pattern: %w", err)
	}
	return g, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// clip bounds an untrusted string for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
