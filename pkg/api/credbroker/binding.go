package credbroker

import (
	"slices"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/policy"
)

// Where a secret may go is decided by whoever stores it. The hosts stored with a secret
// (`nexus secret set NAME --host h1,h2`, exact names or wildcards such as *.example.com) are its
// ceiling: every binding (`--secret NAME@host`, .nexus/config.yaml egress.secrets, an MCP
// sandbox_create) names a subset of them, never another host. A secret stored without hosts has
// no ceiling to check against: only the user's own `nexus create --secret NAME@host` may bind it.

// WithinHosts reports whether host (an exact, normalized name) is one of stored or under one of
// its wildcards. A secret stored without hosts covers no host.
func WithinHosts(stored []string, host string) bool {
	for _, s := range stored {
		if (policy.Rule{Host: s}).MatchesHost(host) {
			return true
		}
	}
	return false
}

// OutsideHostsError refuses a binding of secret to a host its stored hosts do not cover.
func OutsideHostsError(secret, host string, stored []string) error {
	return errdefs.Refused("secret %s may not be sent to %s: it is stored for %s only (to allow it: `nexus secret set %s --host %s,%s`)",
		secret, host, strings.Join(stored, ","), secret, strings.Join(stored, ","), host)
}

// UnhostedError refuses a binding of a secret stored without hosts by anything but the user's own
// `nexus create --secret` (a project config, an MCP call).
func UnhostedError(secret, host string) error {
	return errdefs.Refused("secret %s may not be sent to %s: it is stored without hosts, so only `nexus create --secret %s@%s` can bind it (or store its hosts: `nexus secret set %s --host %s`)",
		secret, host, secret, host, secret, host)
}

// NormalizeStoredHosts checks the hosts a secret is stored with: names, IPv4 literals or
// wildcards (*.example.com), lower case, without ports; duplicates dropped.
func NormalizeStoredHosts(hosts []string) ([]string, error) {
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if strings.ContainsAny(h, ":/@ ") {
			return nil, errdefs.Invalid("host %q: give a host name or *.domain, without a port or path", clipHost(h))
		}
		r, err := policy.Rule{Host: h}.Normalize()
		if err != nil {
			return nil, errdefs.Invalid("host %q: not a host name or *.domain", clipHost(h))
		}
		if !slices.Contains(out, r.Host) {
			out = append(out, r.Host)
		}
	}
	return out, nil
}

// CredentialHeader checks the header a binding names for its credential
// (`--secret NAME@host:header=x-api-key`, egress.secrets[].header) and returns it in lower case.
// "" and "authorization" mean the Authorization field, where the Bearer, token and Basic schemes
// are swapped; another header carries the placeholder as its whole value. Fields that frame or
// route the request cannot carry a credential.
func CredentialHeader(name string) (string, error) {
	h := strings.ToLower(strings.TrimSpace(name))
	if h == "" || h == "authorization" {
		return "", nil
	}
	if len(h) > 64 {
		return "", errdefs.Invalid("header %q: at most 64 characters", clipHost(h))
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return "", errdefs.Invalid("header %q: use letters, digits, '-' and '_'", clipHost(h))
		}
	}
	switch h {
	case "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te",
		"trailer", "proxy-authorization", "proxy-connection", "cookie", "expect":
		return "", errdefs.Invalid("header %q cannot carry a credential", h)
	}
	return h, nil
}

func clipHost(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
