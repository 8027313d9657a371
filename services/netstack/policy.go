package netstack

import (
	"time"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/netaddr"
	"github.com/IniZio/nexus/pkg/policy"
)

// normalizePolicy validates a policy: a known mode (empty means curated), valid rules, and an
// allow-all expiry (zero means now + 24h).
func normalizePolicy(p Policy, now time.Time) (Policy, *policy.Allowlist, error) {
	switch p.Mode {
	case "":
		p.Mode = netstackapi.ModeCurated
	case netstackapi.ModeCurated, netstackapi.ModeAllowAll, netstackapi.ModeNone:
	default:
		return Policy{}, nil, errdefs.Invalid("egress mode %q is not known: use curated, allow-all or none", p.Mode)
	}
	if p.Mode == netstackapi.ModeAllowAll && p.AllowAllUntil.IsZero() {
		p.AllowAllUntil = now.Add(netstackapi.DefaultAllowAllFor)
	}
	if p.Mode != netstackapi.ModeAllowAll {
		p.AllowAllUntil = time.Time{}
	}
	allow, err := policy.NewAllowlist(p.Allow)
	if err != nil {
		return Policy{}, nil, err
	}
	if allow, err = allow.WithDeny(p.Deny); err != nil {
		return Policy{}, nil, err
	}
	p.Allow = allow.Rules()
	p.Deny = allow.Deny()
	p.Repos = append([]string(nil), p.Repos...)
	if len(p.Pending) > maxPolicyPending {
		return Policy{}, nil, errdefs.Invalid("%d pending requests: at most %d", len(p.Pending), maxPolicyPending)
	}
	p.Pending = append([]string(nil), p.Pending...)
	private, err := netaddr.ParseAllowPrivate(p.AllowPrivate)
	if err != nil {
		return Policy{}, nil, errdefs.Invalid("%v", err)
	}
	p.AllowPrivate = netaddr.FormatPrefixes(private)
	return p, allow, nil
}

// effectiveMode is the mode decisions use at now: an expired allow-all is curated (default-deny
// plus the rules). Compared on every decision, so expiry needs no timer.
func effectiveMode(p Policy, now time.Time) string {
	if p.Mode == netstackapi.ModeAllowAll && !now.Before(p.AllowAllUntil) {
		return netstackapi.ModeCurated
	}
	return p.Mode
}
