// Package policy holds the egress allowlist: rules naming hosts and ports, and the matching that
// netstack (L4, DNS, the SNI shim) and mitm (SNI/Host) share, so both layers agree on what a rule
// means.
//
// A rule's host is an exact name ("api.github.com"), a wildcard ("*.github.com": any name strictly
// below github.com, not github.com itself) or an IP literal. A rule without ports means 443 and 80.
// Names are compared lowercase without a trailing dot.
package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// DefaultPorts are the ports of a bare host rule.
var DefaultPorts = []int{443, 80}

// Rule allows connections to a host on some ports.
type Rule struct {
	Host  string `json:"host"`
	Ports []int  `json:"ports,omitempty"`
}

// String renders a rule as host:port[,port…], the form audit events carry in their rule field.
func (r Rule) String() string {
	ports := r.Ports
	if len(ports) == 0 {
		ports = DefaultPorts
	}
	var b strings.Builder
	b.WriteString(r.Host)
	for i, p := range ports {
		if i == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(p))
	}
	return b.String()
}

// ParseRule parses the --allow-host form HOST[:PORT]; a bare host means ports 443 and 80.
// It also reads back what String writes, HOST:PORT,PORT….
func ParseRule(s string) (Rule, error) {
	host, portStr := s, ""
	if i := strings.LastIndexByte(s, ':'); i >= 0 && !strings.Contains(s[:i], ":") {
		host, portStr = s[:i], s[i+1:]
	} else if strings.HasPrefix(s, "[") {
		// [v6]:port is accepted syntactically but refused below: the network is IPv4 only.
		if i := strings.LastIndex(s, "]:"); i >= 0 {
			host, portStr = s[1:i], s[i+2:]
		}
	}
	r := Rule{Host: host}
	if portStr != "" {
		for _, ps := range strings.Split(portStr, ",") {
			p, err := strconv.Atoi(ps)
			if err != nil || p < 1 || p > 65535 {
				return Rule{}, errdefs.Invalid("allow-host %q: port must be a number from 1 to 65535", s)
			}
			r.Ports = append(r.Ports, p)
		}
	}
	return r.Normalize()
}

// Normalize validates a rule and returns it with its host lowercased and its ports deduplicated.
func (r Rule) Normalize() (Rule, error) {
	h, err := normalizePattern(r.Host)
	if err != nil {
		return Rule{}, err
	}
	out := Rule{Host: h}
	for _, p := range r.Ports {
		if p < 1 || p > 65535 {
			return Rule{}, errdefs.Invalid("allow-host %s: port %d is out of range 1-65535", h, p)
		}
		if !slices.Contains(out.Ports, p) {
			out.Ports = append(out.Ports, p)
		}
	}
	return out, nil
}

// AllowsPort reports whether the rule covers port.
func (r Rule) AllowsPort(port int) bool {
	if len(r.Ports) == 0 {
		return slices.Contains(DefaultPorts, port)
	}
	return slices.Contains(r.Ports, port)
}

// MatchesHost reports whether the rule's host pattern covers name (already normalized).
func (r Rule) MatchesHost(name string) bool {
	if suffix, ok := strings.CutPrefix(r.Host, "*."); ok {
		return len(name) > len(suffix)+1 && strings.HasSuffix(name, "."+suffix)
	}
	return name == r.Host
}

func normalizePattern(h string) (string, error) {
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		n, err := NormalizeHost(rest)
		if err != nil {
			return "", err
		}
		if _, err := netip.ParseAddr(n); err == nil {
			return "", errdefs.Invalid("allow-host %q: a wildcard needs a domain name, not an address", h)
		}
		if !strings.Contains(n, ".") {
			return "", errdefs.Invalid("allow-host %q: a wildcard must name at least a two-label domain", h)
		}
		return "*." + n, nil
	}
	return NormalizeHost(h)
}

// NormalizeHost lowercases a host name, drops one trailing dot and checks that it is a valid DNS
// name (letters, digits, '-', '_' in labels of 1-63 bytes, 253 bytes at most) or an IPv4 literal.
// IPv6 literals are refused: the sandbox network is IPv4 only.
func NormalizeHost(h string) (string, error) {
	if a, err := netip.ParseAddr(h); err == nil {
		if !a.Is4() {
			return "", errdefs.Invalid("host %q: IPv6 is not supported, the sandbox network is IPv4 only", truncate(h))
		}
		return a.String(), nil
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "" || len(h) > 253 {
		return "", errdefs.Invalid("host %q: not a valid host name", truncate(h))
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", errdefs.Invalid("host %q: not a valid host name", truncate(h))
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", errdefs.Invalid("host %q: not a valid host name", truncate(h))
			}
		}
	}
	return h, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// ParseRules parses several --allow-host values.
func ParseRules(ss []string) ([]Rule, error) {
	out := make([]Rule, 0, len(ss))
	for _, s := range ss {
		r, err := ParseRule(s)
		if err != nil {
			return nil, fmt.Errorf("parse allowlist: %w", err)
		}
		out = append(out, r)
	}
	return out, nil
}
