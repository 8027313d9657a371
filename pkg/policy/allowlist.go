package policy

import (
	"net/netip"
)

// Allowlist is an immutable, validated set of rules. The zero value allows nothing.
type Allowlist struct {
	rules []Rule
}

// NewAllowlist validates and normalizes rules.
func NewAllowlist(rules []Rule) (*Allowlist, error) {
	a := &Allowlist{rules: make([]Rule, 0, len(rules))}
	for _, r := range rules {
		n, err := r.Normalize()
		if err != nil {
			return nil, err
		}
		a.rules = append(a.rules, n)
	}
	return a, nil
}

// Rules returns a copy of the normalized rules.
func (a *Allowlist) Rules() []Rule {
	if a == nil {
		return nil
	}
	out := make([]Rule, len(a.rules))
	for i, r := range a.rules {
		out[i] = Rule{Host: r.Host, Ports: append([]int(nil), r.Ports...)}
	}
	return out
}

// Empty reports whether the allowlist has no rules.
func (a *Allowlist) Empty() bool { return a == nil || len(a.rules) == 0 }

// MatchName returns the first rule whose host pattern covers name, on any port. DNS uses it: a
// name is resolvable when some rule names it.
func (a *Allowlist) MatchName(name string) (Rule, bool) {
	if a == nil {
		return Rule{}, false
	}
	n, err := NormalizeHost(name)
	if err != nil {
		return Rule{}, false
	}
	for _, r := range a.rules {
		if r.MatchesHost(n) {
			return r, true
		}
	}
	return Rule{}, false
}

// Match returns the first rule covering name on port.
func (a *Allowlist) Match(name string, port int) (Rule, bool) {
	if a == nil {
		return Rule{}, false
	}
	n, err := NormalizeHost(name)
	if err != nil {
		return Rule{}, false
	}
	for _, r := range a.rules {
		if r.MatchesHost(n) && r.AllowsPort(port) {
			return r, true
		}
	}
	return Rule{}, false
}

// MatchAddr returns the first IP-literal rule naming ip on port.
func (a *Allowlist) MatchAddr(ip netip.Addr, port int) (Rule, bool) {
	if a == nil {
		return Rule{}, false
	}
	s := ip.Unmap().String()
	for _, r := range a.rules {
		if r.Host == s && r.AllowsPort(port) {
			return r, true
		}
	}
	return Rule{}, false
}
