package gateway

import (
	"context"
	"reflect"
	"slices"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/policy"
)

// egressApply serves `nexus egress apply`: the hosts and request policy of the project's
// .nexus/config.yaml, read again, replace those of the config the sandbox was created with, and
// so do its egress.limits (those a create flag set stay). egress.secrets (placeholders are
// minted into the guest at create) and egress.allow_private (a widening a file in the agent's
// work tree must not make on a running sandbox) are refused when they changed: the sandbox must
// be created again for those.
func (g *Service) egressApply(ctx context.Context, r api.EgressApplyRequest) (api.EgressChange, error) {
	if r.Via == ViaMCP {
		return api.EgressChange{}, errdefs.Refused("egress apply is not offered over MCP")
	}
	c := r.Config
	if c == nil {
		return api.EgressChange{}, errdefs.Invalid("egress apply: no .nexus/config.yaml given")
	}
	if err := c.Validate(); err != nil {
		return api.EgressChange{}, err
	}
	newRules, err := policy.ParseRules(c.Hosts())
	if err != nil {
		return api.EgressChange{}, errdefs.Invalid("egress apply: %s: %v", c.Source, err)
	}
	mutate := func(sb *api.Sandbox) error {
		if err := liveTarget(sb, time.Now()); err != nil {
			return err
		}
		old := sb.Config
		if old == nil {
			old = &config.Config{}
		}
		switch {
		case !reflect.DeepEqual(old.Egress.Secrets, c.Egress.Secrets):
			return errdefs.Invalid("egress apply: egress.secrets in %s differ from sandbox %s's: placeholders are minted at create, so create it again to change them", c.Source, sb.Name)
		case !slices.Equal(old.Egress.AllowPrivate, c.Egress.AllowPrivate):
			return errdefs.Invalid("egress apply: egress.allow_private in %s differs from sandbox %s's: create it again to change it", c.Source, sb.Name)
		}
		limits := reappliedLimits(sb.Egress.Limits, old.Egress.Limits, c.Egress.Limits)
		if err := limits.Validate(); err != nil {
			return errdefs.Invalid("egress apply: egress.limits in %s: %v", c.Source, err)
		}
		sb.Egress.Limits = limits
		oldRules, err := policy.ParseRules(old.Hosts())
		if err != nil {
			return errdefs.Invalid("sandbox %s: recorded config: %v", sb.Name, err)
		}
		for _, o := range oldRules {
			if !slices.ContainsFunc(newRules, func(n policy.Rule) bool { return n.String() == o.String() }) {
				sb.Egress.Allow = slices.DeleteFunc(sb.Egress.Allow, func(a string) bool { return a == o.String() })
			}
		}
		for _, n := range newRules {
			if err := checkPrivateRule(sb, n); err != nil {
				return err
			}
			if !slices.Contains(sb.Egress.Allow, n.String()) {
				sb.Egress.Allow = append(sb.Egress.Allow, n.String())
			}
		}
		sb.Config = c
		return nil
	}
	if r.DryRun {
		name, err := api.ParseName(r.Name)
		if err != nil {
			return api.EgressChange{}, err
		}
		sb, err := g.reg.Get(ctx, name)
		if err != nil {
			return api.EgressChange{}, err
		}
		next, err := mutated(sb, mutate)
		if err != nil {
			return api.EgressChange{}, err
		}
		ch := api.EgressChange{Sandbox: sb.Name, Before: summaryOf(sb.Egress, time.Now()), After: summaryOf(next.Egress, time.Now())}
		ch.Added, ch.Removed = diff(ch.Before, ch.After)
		return ch, nil
	}
	return g.changeEgress(ctx, r.Name, RuleEgressApply, "", cleanBy(r.By, r.Via), "apply "+c.Source, nil, mutate)
}

// reappliedLimits are a sandbox's recorded budgets rec (its create-time config's, oldCfg,
// under its flags) with the budgets the config set replaced by newCfg's: a budget whose
// recorded value is not the old config's came from a flag and stays.
func reappliedLimits(rec, oldCfg, newCfg netapi.Limits) netapi.Limits {
	pick := func(r, o, n int64) int64 {
		if r == o {
			return n
		}
		return r
	}
	return netapi.Limits{
		MaxConns:         int(pick(int64(rec.MaxConns), int64(oldCfg.MaxConns), int64(newCfg.MaxConns))),
		ConnRate:         int(pick(int64(rec.ConnRate), int64(oldCfg.ConnRate), int64(newCfg.ConnRate))),
		DNSRate:          int(pick(int64(rec.DNSRate), int64(oldCfg.DNSRate), int64(newCfg.DNSRate))),
		EgressBandwidth:  pick(rec.EgressBandwidth, oldCfg.EgressBandwidth, newCfg.EgressBandwidth),
		IngressBandwidth: pick(rec.IngressBandwidth, oldCfg.IngressBandwidth, newCfg.IngressBandwidth),
	}
}
