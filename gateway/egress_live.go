package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/netaddr"
	"github.com/IniZio/nexus/pkg/policy"
)

// Live egress (issue 26): `nexus egress allow|revoke|deny|apply` change a sandbox's policy in
// its record, push it to the running netstack (which closes open connections the new policy
// refuses) and mitm, and audit the change on nexus.audit.gateway.<sandbox> (layer policy).

// Audit rules of live egress changes.
const (
	RuleEgressAllow  = "egress_allow"
	RuleEgressRevoke = "egress_revoke"
	RuleEgressDeny   = policy.RuleDenied
	RuleEgressApply  = "egress_apply"
	RuleGrantExpired = "grant_expired"
)

// Bounds of live changes.
const (
	// MaxGrantFor is the longest --for a grant or deny may ask.
	MaxGrantFor = 366 * 24 * time.Hour
	// MaxGrants bounds a sandbox's grants and denies together.
	MaxGrants = 256
	// GrantSweepEvery is how often the gateway looks for expired grants besides the next
	// expiry it knows of (grants made by another gateway, records changed meanwhile).
	GrantSweepEvery = 30 * time.Second
	maxBy           = 64
)

// liveAllowlist is a sandbox's policy in force at now: its recorded allowlist plus its active
// grants, and its active denies.
func liveAllowlist(e api.Egress, now time.Time) ([]policy.Rule, []string, error) {
	allow := slices.Clone(e.Allow)
	for _, g := range e.Grants {
		if g.Active(now) {
			allow = append(allow, g.Rule)
		}
	}
	rules, err := policy.ParseRules(dedupe(allow))
	if err != nil {
		return nil, nil, err
	}
	var deny []string
	for _, d := range e.Denies {
		if d.Active(now) && !slices.Contains(deny, d.Rule) {
			deny = append(deny, d.Rule)
		}
	}
	return rules, deny, nil
}

// policySummary renders rules and denies for people and audit events: "a:443,80 !b".
func policySummary(rules []policy.Rule, deny []string) []string {
	out := make([]string, 0, len(rules)+len(deny))
	for _, r := range rules {
		out = append(out, r.String())
	}
	for _, d := range deny {
		out = append(out, "!"+d)
	}
	return out
}

func summaryOf(e api.Egress, now time.Time) []string {
	rules, deny, err := liveAllowlist(e, now)
	if err != nil {
		return []string{"invalid: " + err.Error()}
	}
	return policySummary(rules, deny)
}

// hostsOf are the mitm's hostnames for rules.
func hostsOf(rules []policy.Rule) []string {
	var hosts []string
	for _, r := range rules {
		if !slices.Contains(hosts, r.Host) {
			hosts = append(hosts, r.Host)
		}
	}
	return hosts
}

// cleanBy bounds and strips the caller's name of itself.
func cleanBy(by, via string) string {
	clean := func(s string) string {
		s = strings.Map(func(r rune) rune {
			if unicode.IsControl(r) || r == unicode.ReplacementChar {
				return -1
			}
			return r
		}, s)
		s = strings.TrimSpace(s)
		if len(s) > maxBy {
			s = s[:maxBy]
		}
		return s
	}
	by, via = clean(by), clean(via)
	switch {
	case by == "" && via == "":
		return "unknown"
	case via == "":
		return by
	case by == "":
		return "via " + via
	}
	return by + " via " + via
}

// liveTarget refuses live changes a sandbox's mode cannot take.
func liveTarget(sb *api.Sandbox, now time.Time) error {
	switch sb.Egress.Mode {
	case api.EgressNone:
		return errdefs.Invalid("sandbox %s has egress none: it has no network device, so no host can be allowed; create it again with --allow-host or an agent profile", sb.Name)
	case api.EgressAllowAll:
		if now.Before(sb.Egress.AllowAllUntil) {
			return errdefs.Conflict("sandbox %s is allow-all until %s: it is already open and takes no per-host rules", sb.Name, sb.Egress.AllowAllUntil.UTC().Format(time.RFC3339))
		}
		return errdefs.Conflict("sandbox %s was allow-all (expired %s): it has no MITM for per-host rules; create it again with --allow-host", sb.Name, sb.Egress.AllowAllUntil.UTC().Format(time.RFC3339))
	}
	return nil
}

// grantUntil validates --for.
func grantUntil(d time.Duration, now time.Time) (time.Time, error) {
	switch {
	case d < 0:
		return time.Time{}, errdefs.Invalid("--for %s is negative: give a duration such as 30m", d)
	case d > MaxGrantFor:
		return time.Time{}, errdefs.Invalid("--for %s is longer than %s", d, MaxGrantFor)
	case d == 0:
		return time.Time{}, nil
	}
	return now.Add(d).UTC(), nil
}

// checkPrivateRule refuses a rule naming a non-public address the sandbox may not reach: the
// perimeter's private-address rule holds for grants (names are judged by their DNS answers).
func checkPrivateRule(sb *api.Sandbox, r policy.Rule) error {
	a, err := netip.ParseAddr(r.Host)
	if err != nil {
		return nil
	}
	prefixes, err := netaddr.ParseAllowPrivate(sb.Egress.AllowPrivate)
	if err != nil {
		return errdefs.Invalid("sandbox %s: recorded allow_private: %v", sb.Name, err)
	}
	if err := netaddr.NewGuard(prefixes, netaddr.HostAddresses()).Check(a); err != nil {
		return errdefs.Invalid("cannot allow %s on %s: %v (private addresses open only with --allow-private at create)", r.Host, sb.Name, err)
	}
	return nil
}

func (g *Service) egressAllow(ctx context.Context, r api.EgressChangeRequest) (api.EgressChange, error) {
	if err := g.mcpEgressOff(r); err != nil {
		return api.EgressChange{}, err
	}
	rule, err := policy.ParseRule(r.Host)
	if err != nil {
		return api.EgressChange{}, err
	}
	now := time.Now()
	until, err := grantUntil(r.For, now)
	if err != nil {
		return api.EgressChange{}, err
	}
	grant := api.Grant{Rule: rule.String(), By: cleanBy(r.By, r.Via), At: now.UTC(), Until: until}
	reason := "allow " + grant.Rule + untilText(until)
	return g.changeEgress(ctx, r.Name, RuleEgressAllow, rule.Host, grant.By, reason, &grant, func(sb *api.Sandbox) error {
		if err := liveTarget(sb, now); err != nil {
			return err
		}
		if err := checkPrivateRule(sb, rule); err != nil {
			return err
		}
		if r.Via == ViaMCP {
			if err := g.mcpGrantLimits(ctx, sb, rule); err != nil {
				return err
			}
		}
		for _, d := range sb.Egress.Denies {
			if d.Active(now) && ((policy.Rule{Host: d.Rule}).MatchesHost(rule.Host) || d.Rule == rule.Host) {
				return errdefs.Conflict("%s is denied on %s (%s by %s): lift the deny first with `nexus egress revoke %s %s`", rule.Host, sb.Name, d.Rule, d.By, sb.Name, d.Rule)
			}
		}
		sb.Egress.Grants = slices.DeleteFunc(sb.Egress.Grants, func(x api.Grant) bool { return x.Rule == grant.Rule })
		return appendGrant(&sb.Egress.Grants, sb, grant)
	})
}

func (g *Service) egressDeny(ctx context.Context, r api.EgressChangeRequest) (api.EgressChange, error) {
	if err := g.mcpEgressOff(r); err != nil {
		return api.EgressChange{}, err
	}
	deny, err := (policy.Rule{Host: r.Host}).Normalize()
	if err != nil {
		return api.EgressChange{}, err
	}
	if strings.Contains(r.Host, ":") && !strings.HasPrefix(r.Host, "[") {
		return api.EgressChange{}, errdefs.Invalid("nexus egress deny takes a host without ports (%q): a deny covers every port", r.Host)
	}
	now := time.Now()
	until, err := grantUntil(r.For, now)
	if err != nil {
		return api.EgressChange{}, err
	}
	d := api.Grant{Rule: deny.Host, By: cleanBy(r.By, r.Via), At: now.UTC(), Until: until}
	return g.changeEgress(ctx, r.Name, RuleEgressDeny, deny.Host, d.By, "deny "+d.Rule+untilText(until), &d, func(sb *api.Sandbox) error {
		if err := liveTarget(sb, now); err != nil {
			return err
		}
		sb.Egress.Denies = slices.DeleteFunc(sb.Egress.Denies, func(x api.Grant) bool { return x.Rule == d.Rule })
		return appendGrant(&sb.Egress.Denies, sb, d)
	})
}

func (g *Service) egressRevoke(ctx context.Context, r api.EgressChangeRequest) (api.EgressChange, error) {
	if err := g.mcpEgressOff(r); err != nil {
		return api.EgressChange{}, err
	}
	host, err := (policy.Rule{Host: r.Host}).Normalize()
	if err != nil {
		rule, perr := policy.ParseRule(r.Host) // HOST:PORTS revokes that grant exactly
		if perr != nil {
			return api.EgressChange{}, err
		}
		host = rule
	}
	by := cleanBy(r.By, r.Via)
	return g.changeEgress(ctx, r.Name, RuleEgressRevoke, host.Host, by, "revoke "+r.Host, nil, func(sb *api.Sandbox) error {
		n := len(sb.Egress.Grants) + len(sb.Egress.Denies)
		exact := len(host.Ports) > 0
		sb.Egress.Grants = slices.DeleteFunc(sb.Egress.Grants, func(x api.Grant) bool {
			if exact {
				return x.Rule == host.String()
			}
			xr, err := policy.ParseRule(x.Rule)
			return err == nil && xr.Host == host.Host
		})
		if !exact {
			sb.Egress.Denies = slices.DeleteFunc(sb.Egress.Denies, func(x api.Grant) bool { return x.Rule == host.Host })
		}
		if len(sb.Egress.Grants)+len(sb.Egress.Denies) == n {
			return errdefs.NotFound("sandbox %s has no grant or deny for %s (its create-time hosts are refused with `nexus egress deny %s %s`)", sb.Name, r.Host, sb.Name, host.Host)
		}
		return nil
	})
}

func appendGrant(list *[]api.Grant, sb *api.Sandbox, g api.Grant) error {
	if len(sb.Egress.Grants)+len(sb.Egress.Denies) >= MaxGrants {
		return errdefs.Invalid("sandbox %s has %d grants and denies, the most it may have: revoke some first", sb.Name, MaxGrants)
	}
	*list = append(*list, g)
	return nil
}

func untilText(t time.Time) string {
	if t.IsZero() {
		return " until revoked"
	}
	return " until " + t.UTC().Format(time.RFC3339)
}

// changeEgress applies mutate to the named sandbox's record (read again when someone else
// changed it meanwhile), pushes the new policy to its running perimeter and audits the change.
func (g *Service) changeEgress(ctx context.Context, name, rule, host, by, reason string, grant *api.Grant, mutate func(*api.Sandbox) error) (api.EgressChange, error) {
	name, err := api.ParseName(name)
	if err != nil {
		return api.EgressChange{}, err
	}
	for attempt := 0; ; attempt++ {
		sb, err := g.reg.Get(ctx, name)
		if err != nil {
			return api.EgressChange{}, err
		}
		before := summaryOf(sb.Egress, time.Now())
		next, err := mutated(sb, mutate)
		if err != nil {
			return api.EgressChange{}, err
		}
		err = g.reg.Update(ctx, next)
		if errors.Is(err, errdefs.ErrConflict) && attempt < 5 {
			continue
		}
		if err != nil {
			return api.EgressChange{}, err
		}
		return g.afterChange(ctx, next, before, rule, host, by, reason, grant), nil
	}
}

// mutated is a copy of sb changed by mutate; sb is untouched.
func mutated(sb *api.Sandbox, mutate func(*api.Sandbox) error) (*api.Sandbox, error) {
	next := *sb
	next.Egress.Grants = slices.Clone(sb.Egress.Grants)
	next.Egress.Denies = slices.Clone(sb.Egress.Denies)
	next.Egress.Allow = slices.Clone(sb.Egress.Allow)
	if err := mutate(&next); err != nil {
		return nil, err
	}
	return &next, nil
}

// diff is what after has that before has not, and the other way round.
func diff(before, after []string) (added, removed []string) {
	for _, a := range after {
		if !slices.Contains(before, a) {
			added = append(added, a)
		}
	}
	for _, b := range before {
		if !slices.Contains(after, b) {
			removed = append(removed, b)
		}
	}
	return added, removed
}

// afterChange pushes a recorded change to the running perimeter and audits it.
func (g *Service) afterChange(ctx context.Context, sb *api.Sandbox, before []string, rule, host, by, reason string, grant *api.Grant) api.EgressChange {
	after := summaryOf(sb.Egress, time.Now())
	ch := api.EgressChange{Sandbox: sb.Name, Before: before, After: after, Grant: grant}
	ch.Added, ch.Removed = diff(before, after)
	live, err := g.pushEgress(ctx, sb)
	ch.Live = live
	if err != nil {
		reason += " (not applied to the running sandbox yet: " + err.Error() + "; retried within " + GrantSweepEvery.String() + ")"
	}
	decision := audit.Allow
	if rule == RuleEgressDeny || rule == RuleEgressRevoke || rule == RuleGrantExpired {
		decision = audit.Deny
	}
	g.emitAudit(audit.Event{Sandbox: sb.ID, Name: sb.Name, Layer: audit.LayerPolicy, Host: host, Decision: decision, Rule: rule,
		Reason: reason, By: by, Before: joinSummary(before), After: joinSummary(after)})
	g.wakeGrants()
	return ch
}

func joinSummary(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, " ")
}

// pushEgress sends a sandbox's live policy to its netstack and mitm. A sandbox without a
// network (stopped, never booted) is not an error: its next boot reads the record.
func (g *Service) pushEgress(ctx context.Context, sb *api.Sandbox) (bool, error) {
	plan, err := planFromRecord(sb)
	if err != nil {
		return false, err
	}
	if plan.egress.Mode == api.EgressNone {
		return false, nil
	}
	limits := plan.egress.Limits
	_, err = netapi.NewClient(g.cfg.Bus, sb.Host).Update(ctx, netapi.UpdateRequest{SandboxID: sb.ID, Policy: plan.netPolicy(), Limits: &limits})
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("netstack: %w", err)
	}
	if plan.egress.Mode == api.EgressCurated {
		req := requestPolicy(sb)
		hr := mitmapi.SetHostsRequest{ID: sb.ID, AllowedHosts: plan.hosts, DeniedHosts: plan.deny, AllowPrivate: plan.egress.AllowPrivate}
		if !req.Empty() {
			hr.Requests = &req
		}
		if err := mitmapi.NewClient(g.cfg.Bus, sb.Host).SetHosts(ctx, hr); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return true, fmt.Errorf("mitm: %w", err)
		}
	}
	return true, nil
}

func (g *Service) emitAudit(ev audit.Event) {
	ev.Time = time.Now().UTC()
	if g.audit != nil {
		g.audit.Emit(context.Background(), ev)
	}
	g.log.Info().Str("sandbox", ev.Name).Str("rule", ev.Rule).Str("host", ev.Host).Str("by", ev.By).Str("after", ev.After).Msg("egress changed")
}

// wakeGrants makes the expiry watcher look again (a grant with a nearer end was just made).
func (g *Service) wakeGrants() {
	select {
	case g.grantWake <- struct{}{}:
	default:
	}
}

// watchGrants drops grants and denies whose time is up, each an audited narrowing (or, for a
// deny, widening) pushed to the running perimeter within a second of its end.
func (g *Service) watchGrants(ctx context.Context) {
	for {
		next := g.expireGrants(ctx, time.Now())
		wait := GrantSweepEvery
		if !next.IsZero() {
			wait = min(wait, max(time.Until(next), 0))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-g.grantWake:
			t.Stop()
		}
	}
}

// expireGrants removes what expired by now from every record and returns the next expiry.
// A record whose live push failed earlier is pushed again here.
func (g *Service) expireGrants(ctx context.Context, now time.Time) time.Time {
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	all, err := g.reg.List(lctx, nil)
	if err != nil {
		g.log.Warn().Err(err).Msg("grant expiry: cannot list sandboxes")
		return now.Add(time.Second)
	}
	var next time.Time
	for _, sb := range all {
		var gone []api.Grant
		for _, l := range [][]api.Grant{sb.Egress.Grants, sb.Egress.Denies} {
			for _, x := range l {
				if !x.Active(now) {
					gone = append(gone, x)
				} else if !x.Until.IsZero() && (next.IsZero() || x.Until.Before(next)) {
					next = x.Until
				}
			}
		}
		if len(gone) == 0 {
			continue
		}
		var names []string
		for _, x := range gone {
			names = append(names, x.Rule)
		}
		_, err := g.changeEgress(lctx, sb.Name, RuleGrantExpired, names[0], "nexus (expiry)", "expired: "+strings.Join(names, " "), nil, func(sb *api.Sandbox) error {
			active := func(x api.Grant) bool { return !x.Active(now) }
			sb.Egress.Grants = slices.DeleteFunc(sb.Egress.Grants, active)
			sb.Egress.Denies = slices.DeleteFunc(sb.Egress.Denies, active)
			return nil
		})
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			g.log.Warn().Err(err).Str("sandbox", sb.Name).Msg("grant expiry: not recorded; retried")
			next = now.Add(time.Second)
		}
	}
	return next
}
