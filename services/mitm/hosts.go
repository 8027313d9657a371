package mitm

import (
	"fmt"
	"net"
	"strings"
)

// normalizeHost returns the canonical form of a hostname or IP literal: lower case, no trailing
// dot, no brackets. It refuses anything that is not a plausible DNS name or IP, so the result is
// safe to echo in a one-line reason or an HTTP header.
func normalizeHost(h string) (string, error) {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	if h == "" || len(h) > 253 {
		return "", fmt.Errorf("bad host name")
	}
	if ip := net.ParseIP(h); ip != nil {
		return ip.String(), nil
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "", fmt.Errorf("bad host name")
		}
	}
	if strings.HasPrefix(h, ".") || strings.HasSuffix(h, ".") || strings.Contains(h, "..") {
		return "", fmt.Errorf("bad host name")
	}
	return h, nil
}

// splitHostPort splits "host:port" (port optional, default def) and normalizes the host.
func splitHostPort(hostport, def string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, def
	}
	if port == "" {
		port = def
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return "", "", fmt.Errorf("bad port")
		}
	}
	if len(port) > 5 {
		return "", "", fmt.Errorf("bad port")
	}
	host, err = normalizeHost(host)
	return host, port, err
}

// HostSet is a hostname allowlist: exact names plus "*.suffix" patterns, which match any name
// strictly below suffix (not suffix itself).
type HostSet struct {
	exact    map[string]struct{}
	suffixes []string // ".example.com"
}

// NewHostSet builds a set from patterns; an invalid pattern is an error.
func NewHostSet(patterns []string) (HostSet, error) {
	s := HostSet{exact: make(map[string]struct{}, len(patterns))}
	for _, p := range patterns {
		if rest, ok := strings.CutPrefix(p, "*."); ok {
			h, err := normalizeHost(rest)
			if err != nil {
				return HostSet{}, fmt.Errorf("host pattern %q: %w", p, err)
			}
			s.suffixes = append(s.suffixes, "."+h)
			continue
		}
		h, err := normalizeHost(p)
		if err != nil {
			return HostSet{}, fmt.Errorf("host pattern %q: %w", p, err)
		}
		s.exact[h] = struct{}{}
	}
	return s, nil
}

// Match reports whether the normalized host is in the set.
func (s HostSet) Match(host string) bool {
	if _, ok := s.exact[host]; ok {
		return true
	}
	for _, suf := range s.suffixes {
		if len(host) > len(suf) && strings.HasSuffix(host, suf) {
			return true
		}
	}
	return false
}

// Empty reports whether the set matches nothing.
func (s HostSet) Empty() bool { return len(s.exact) == 0 && len(s.suffixes) == 0 }
