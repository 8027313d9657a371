package policy

import (
	"net/netip"
)

// RuleDenied is the audit rule of a refusal by an explicit deny (`nexus egress deny`).
const RuleDenied = "egress_deny"

// Allowlist is an immutable, validated set of rules. The zero value allows nothing.
type Allowlist struct {
	rules []Rule
	// deny are host patterns (`nexus egress deny`) that no rule allows, whatever its origin.
	deny []Rule
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

// WithDeny returns a copy of a whose matches exclude every name (and IP literal) covered by one
// of the host patterns in deny: an explicit deny beats every allow rule.
func (a *Allowlist) WithDeny(deny []string) (*Allowlist, error) {
	out := &Allowlist{}
	if a != nil {
		out.rules = a.rules
	}
	for _, d := range deny {
		h, err := normalizePattern(d)
		if err != nil {
			return nil, err
		}
		out.deny = append(out.deny, Rule{Host: h})
	}
	return out, nil
}

// Deny returns the deny patterns.
func (a *Allowlist) Deny() []string {
	if a == nil {
		return nil
	}
	out := make([]string, len(a.deny))
	for i, r := range a.deny {
		out[i] = r.Host
	}
	return out
}

// Denied returns the deny pattern covering name (normalized or not), if any.
func (a *Allowlist) Denied(name string) (string, bool) {
	if a == nil || len(a.deny) == 0 {
		return "", false
	}
	n, err := NormalizeHost(name)
	if err != nil {
		return "", false
	}
	for _, r := range a.deny {
		if r.MatchesHost(n) {
			return r.Host, true
		}
	}
	return "", false
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
	if _, denied := a.Denied(n); denied {
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
	if _, denied := a.Denied(n); denied {
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
	if _, denied := a.Denied(s); denied {
		return Rule{}, false
	}
	for _, r := range a.rules {
		if r.Host == s && r.AllowsPort(port) {
			return r, true
		}
	}
	return Rule{}, false
}
