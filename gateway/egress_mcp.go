package gateway

import (
	"context"
	"net/netip"
	"strings"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/netaddr"
	"github.com/IniZio/nexus/pkg/policy"
)

// ViaMCP is the Via of live egress changes made by the MCP tools (egress_allow, egress_revoke).
// An orchestrating agent can be prompt-injected, so they are off unless the stack runs with
// --mcp-egress, and even then never open a private address or a host a secret is bound to.
const ViaMCP = "mcp"

// mcpEgressOff refuses a change that came over MCP while --mcp-egress is off.
func (g *Service) mcpEgressOff(r api.EgressChangeRequest) error {
	if r.Via == ViaMCP && !g.cfg.MCPEgress {
		return errdefs.Refused("egress changes over MCP are off: the operator enables them with `nexus up --mcp-egress` (NEXUS_MCP_EGRESS=true), or runs `nexus egress allow %s %s`",
			clipArg(r.Name), clipArg(r.Host))
	}
	return nil
}

// mcpGrantLimits refuses, for a grant over MCP, an IP literal outside the public internet
// (whatever --allow-private says) and any host that overlaps a host a secret is bound to:
// the sandbox's bindings and every stored secret's hosts.
func (g *Service) mcpGrantLimits(ctx context.Context, sb *api.Sandbox, rule policy.Rule) error {
	if a, err := netip.ParseAddr(rule.Host); err == nil {
		if !a.IsGlobalUnicast() || netaddr.Special(a) != "" {
			return errdefs.Refused("egress_allow may not open %s on %s: MCP never grants a private address", rule.Host, sb.Name)
		}
	}
	secretHosts := map[string]string{}
	for _, s := range sb.Secrets {
		for _, h := range s.Hosts {
			secretHosts[h] = s.Name
		}
	}
	list, err := g.cred().SecretList(ctx)
	if err != nil {
		return errdefs.Unavailable("egress_allow: cannot check the hosts secrets are bound to (%v); refused", err)
	}
	for _, s := range list.Secrets {
		for _, h := range s.Hosts {
			secretHosts[h] = s.Name
		}
	}
	for h, name := range secretHosts {
		if patternsOverlap(rule.Host, strings.ToLower(h)) {
			return errdefs.Refused("egress_allow may not open %s on %s: secret %s is bound to %s; only the operator grants it (`nexus egress allow`)", rule.Host, sb.Name, name, h)
		}
	}
	return nil
}

// patternsOverlap reports whether two host patterns (names or *.domain) can name one host.
func patternsOverlap(a, b string) bool {
	ra, rb := policy.Rule{Host: a}, policy.Rule{Host: b}
	if a == b || ra.MatchesHost(b) || rb.MatchesHost(a) {
		return true
	}
	// Two wildcards overlap when one's domain is under (or is) the other's.
	sa, oka := strings.CutPrefix(a, "*.")
	sb, okb := strings.CutPrefix(b, "*.")
	return oka && okb && (sa == sb || strings.HasSuffix(sa, "."+sb) || strings.HasSuffix(sb, "."+sa))
}
