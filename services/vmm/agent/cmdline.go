package agent

import "strings"

// Cmdline is a parsed kernel command line.
type Cmdline struct {
	tokens []string
}

// ParseCmdline splits a kernel command line into tokens; double quotes group spaces (as the
// kernel does: param="a b") and are removed.
func ParseCmdline(s string) Cmdline {
	var toks []string
	var cur strings.Builder
	inQuote, have := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			have = true
		case !inQuote && (r == ' ' || r == '\t' || r == '\n'):
			if have {
				toks = append(toks, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		toks = append(toks, cur.String())
	}
	return Cmdline{tokens: toks}
}

// Get returns the value of the last key=value token for key ("" when absent).
func (c Cmdline) Get(key string) string {
	v := ""
	for _, t := range c.tokens {
		if k, val, ok := strings.Cut(t, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// ModuleParams returns the parameters for module mod from "<mod>.<param>=<value>" tokens, space
// separated in command line order ('-' and '_' are the same in module names, as in the kernel).
func (c Cmdline) ModuleParams(mod string) string {
	want := normModule(mod)
	var out []string
	for _, t := range c.tokens {
		eq := strings.IndexByte(t, '=')
		dot := strings.IndexByte(t, '.')
		if dot <= 0 || (eq >= 0 && dot > eq) || dot == len(t)-1 {
			continue
		}
		if normModule(t[:dot]) != want {
			continue
		}
		p := t[dot+1:]
		if k, v, ok := strings.Cut(p, "="); ok && strings.ContainsAny(v, " \t") {
			p = k + `="` + v + `"`
		}
		out = append(out, p)
	}
	return strings.Join(out, " ")
}

func normModule(s string) string { return strings.ReplaceAll(s, "-", "_") }
