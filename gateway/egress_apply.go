package gateway

import (
	"context"
	"reflect"
	"slices"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/policy"
)

// egressApply serves `nexus egress apply`: the hosts and request policy of the project's
// .nexus/config.yaml, read again, replace those of the config the sandbox was created with.
// What is minted or sized at create (egress.secrets, egress.allow_private, egress.limits) is
// refused when it changed: the sandbox must be created again for those.
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
		case old.Egress.Limits != c.Egress.Limits:
			return errdefs.Invalid("egress apply: egress.limits in %s differ from sandbox %s's: create it again to change them", c.Source, sb.Name)
		}
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
