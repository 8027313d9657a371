package gateway

import (
	"regexp"
	"slices"
	"strings"
	"time"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/netaddr"
	"github.com/IniZio/nexus/pkg/policy"
	"github.com/IniZio/nexus/pkg/profile"
)

// DefaultAllowAll is how long --egress allow-all lasts when no duration is given.
const DefaultAllowAll = 24 * time.Hour

// GitHubHosts are the hosts a --repo binding brings.
var GitHubHosts = []string{"github.com", "api.github.com", "uploads.github.com", "codeload.github.com"}

// GitHubSecret is the named secret brokered as GH_TOKEN for --repo sandboxes, when it is set
// (`nexus secret set GH_TOKEN --command 'gh auth token'`).
const GitHubSecret = "GH_TOKEN"

var repoRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$`)

// egressPlan is the perimeter a create asks for, validated.
type egressPlan struct {
	egress  api.Egress
	rules   []policy.Rule
	hosts   []string // hostnames the mitm allows
	deny    []string // host patterns denied live (nexus egress deny)
	secrets []api.SecretBinding
	config  *config.Config // the project's .nexus/config.yaml, validated
}

// addSecret adds a binding, merging the hosts of one already bound under the same name
// (--repo's GH_TOKEN and a config's GH_TOKEN are one placeholder).
func (p *egressPlan) addSecret(b api.SecretBinding) {
	for i := range p.secrets {
		if p.secrets[i].Name == b.Name {
			for _, h := range b.Hosts {
				if !slices.Contains(p.secrets[i].Hosts, h) {
					p.secrets[i].Hosts = append(p.secrets[i].Hosts, h)
				}
			}
			if p.secrets[i].Env == "" {
				p.secrets[i].Env = b.Env
			}
			if p.secrets[i].Header == "" {
				p.secrets[i].Header = b.Header
			}
			return
		}
	}
	p.secrets = append(p.secrets, b)
}

// bindings are the credbroker bindings of the plan's secrets.
func (p *egressPlan) bindings() []credapi.Binding {
	var out []credapi.Binding
	for _, s := range p.secrets {
		out = append(out, credapi.Binding{Secret: s.Name, Hosts: s.Hosts, Kind: s.Kind, Env: s.Env, Header: s.Header})
	}
	return out
}

// planFromRecord rebuilds the plan of a recorded sandbox, for every boot after the first and
// every live change: the same allowlist with its active grants and denies, the same allow-all
// expiry, the same secrets (minted afresh at a boot).
func planFromRecord(sb *api.Sandbox) (*egressPlan, error) {
	rules, deny, err := liveAllowlist(sb.Egress, time.Now())
	if err != nil {
		return nil, errdefs.Invalid("sandbox %s: recorded allowlist: %v", sb.Name, err)
	}
	return &egressPlan{egress: sb.Egress, rules: rules, secrets: sb.Secrets, hosts: hostsOf(rules), deny: deny}, nil
}

// netPolicy is the netstack's policy of the plan.
func (p *egressPlan) netPolicy() netapi.Policy {
	pol := netapi.Policy{Mode: p.egress.Mode, AllowAllUntil: p.egress.AllowAllUntil, Allow: p.rules, Repos: p.egress.Repos,
		AllowPrivate: p.egress.AllowPrivate, Deny: p.deny, Ask: p.egress.Ask && p.egress.Mode == api.EgressCurated}
	if pol.Ask {
		for _, r := range p.egress.Requests {
			pol.Pending = append(pol.Pending, netapi.PendingKey(r.Host, r.Port))
		}
	}
	return pol
}

// planEgress turns the create flags and the agent profile into an egress plan.
// Curated is the default whenever the allowlist is non-empty; allow-all always expires.
// Every secret binding stays within the hosts stored with its secret (storedSecrets.allowedHosts).
func planEgress(r api.CreateRequest, prof profile.Profile, now time.Time, stored storedSecrets) (*egressPlan, error) {
	secretExists := func(name string) bool { _, ok := stored(name); return ok }
	p := &egressPlan{}
	var allow []string
	allow = append(allow, prof.EgressHosts...)
	for _, h := range r.AllowHosts {
		if _, err := policy.ParseRule(h); err != nil {
			return nil, errdefs.Invalid("invalid --allow-host %q: %v", h, err)
		}
		allow = append(allow, h)
	}
	for _, repo := range r.Repos {
		if !repoRE.MatchString(repo) || strings.Contains(repo, "..") {
			return nil, errdefs.Invalid("invalid --repo %q: use owner/repo", repo)
		}
		p.egress.Repos = append(p.egress.Repos, strings.ToLower(repo))
	}
	if len(r.Repos) > 0 {
		allow = append(allow, GitHubHosts...)
		if secretExists(GitHubSecret) && !r.NoStoredSecrets {
			hosts, _ := stored.allowedHosts(bindDefault, "--repo", GitHubSecret, []string{"api.github.com", "uploads.github.com", "github.com"})
			if len(hosts) > 0 {
				p.secrets = append(p.secrets, api.SecretBinding{Name: GitHubSecret, Hosts: hosts, Kind: credapi.KindGitHub})
			}
		}
	}
	origin := bindRequest
	if r.UserSecrets {
		origin = bindUser
	}
	for _, s := range r.Secrets {
		name, hosts, header, err := parseSecretFlag(s)
		if err != nil {
			return nil, err
		}
		if !secretExists(name) {
			return nil, errdefs.Invalid("--secret %s: no secret named %s: set it first with `nexus secret set %s`", s, name, name)
		}
		if _, err := stored.allowedHosts(origin, "--secret "+s, name, hosts); err != nil {
			return nil, err
		}
		allow = append(allow, hosts...)
		p.secrets = append(p.secrets, api.SecretBinding{Name: name, Hosts: hosts, Kind: kindOf(name), Env: envOf(name), Header: header})
	}
	private := r.AllowPrivate
	if c := r.Config; c != nil {
		// .nexus/config.yaml: its open, policy-gated and secret hosts join the allowlist (the
		// mitm's request policy then gates the policy hosts), its secrets are brokered.
		if err := c.Validate(); err != nil {
			return nil, err
		}
		private = append(slices.Clone(private), c.Egress.AllowPrivate...)
		p.config = c
		allow = append(allow, c.Hosts()...)
		for _, s := range c.Egress.Secrets {
			if !secretExists(s.Name) {
				return nil, errdefs.Invalid("egress.secrets in %s: no secret named %s: set it first with `nexus secret set %s`", c.Source, s.Name, s.Name)
			}
			if _, err := stored.allowedHosts(bindConfig, "egress.secrets in "+c.Source, s.Name, s.Hosts); err != nil {
				return nil, err
			}
			env := s.Env
			if env == "" {
				env = envOf(s.Name)
			}
			p.addSecret(api.SecretBinding{Name: s.Name, Hosts: s.Hosts, Kind: kindOf(s.Name), Env: env, Header: s.Header})
		}
	}
	for _, s := range prof.Secrets {
		if secretExists(s.Name) && !r.NoStoredSecrets {
			allow = append(allow, s.Hosts...)
			if hosts, _ := stored.allowedHosts(bindDefault, "agent "+prof.Name, s.Name, s.Hosts); len(hosts) > 0 {
				p.secrets = append(p.secrets, api.SecretBinding{Name: s.Name, Hosts: hosts, Kind: s.Kind, Env: s.Env})
			}
		}
	}
	prefixes, err := netaddr.ParseAllowPrivate(private)
	if err != nil {
		return nil, errdefs.Invalid("%v", err)
	}
	p.egress.AllowPrivate = dedupe(netaddr.FormatPrefixes(prefixes))
	rules, err := policy.ParseRules(dedupe(allow))
	if err != nil {
		return nil, errdefs.Invalid("invalid allowlist: %v", err)
	}
	p.rules = rules
	for _, rule := range rules {
		if !slices.Contains(p.hosts, rule.Host) {
			p.hosts = append(p.hosts, rule.Host)
		}
		p.egress.Allow = append(p.egress.Allow, rule.String())
	}
	var limits netapi.Limits
	if r.Config != nil {
		limits = r.Config.Egress.Limits
	}
	p.egress.Limits = limits.Merge(r.Limits)
	p.egress.Ask = r.EgressAsk || (r.Config != nil && r.Config.Egress.Ask)
	if err := p.egress.Limits.Validate(); err != nil {
		return nil, err
	}
	mode, arg, _ := strings.Cut(r.EgressMode, "=")
	switch mode {
	case "":
		p.egress.Mode = api.EgressCurated
		if len(rules) == 0 {
			p.egress.Mode = api.EgressNone
		}
	case api.EgressCurated:
		p.egress.Mode = api.EgressCurated
	case api.EgressNone:
		if arg != "" {
			return nil, errdefs.Invalid("invalid --egress %q: none takes no duration", r.EgressMode)
		}
		if len(r.AllowHosts) > 0 || len(r.Repos) > 0 || len(r.AllowPrivate) > 0 {
			return nil, errdefs.Invalid("--egress none contradicts --allow-host, --repo and --allow-private: a sandbox without egress reaches nothing (drop them, or use --egress curated)")
		}
		p.egress.Mode = api.EgressNone
		p.secrets = nil
	case api.EgressAllowAll:
		d := DefaultAllowAll
		if arg != "" {
			var err error
			if d, err = time.ParseDuration(arg); err != nil || d <= 0 {
				return nil, errdefs.Invalid("invalid --egress %q: allow-all=DURATION takes a Go duration such as 30m or 72h", r.EgressMode)
			}
		}
		p.egress.Mode = api.EgressAllowAll
		p.egress.AllowAllUntil = now.Add(d).UTC()
		// Allow-all has no MITM and seeds no credentials (the spec's AllowAll mode).
		p.secrets = nil
	default:
		return nil, errdefs.Invalid("invalid --egress %q: use curated, allow-all[=DURATION] or none", r.EgressMode)
	}
	return p, nil
}

func dedupe(in []string) []string {
	var out []string
	for _, s := range in {
		s = strings.ToLower(strings.TrimSpace(s))
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// kindOf infers a credential kind from the secret's name.
func kindOf(name string) string {
	switch strings.ToUpper(name) {
	case "GH_TOKEN", "GITHUB_TOKEN":
		return credapi.KindGitHub
	case "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY":
		return credapi.KindAnthropic
	case "OPENAI_API_KEY":
		return credapi.KindOpenAI
	}
	return credapi.KindGeneric
}

// envOf names the guest variable of a generic secret: the secret's own name when it is a valid
// variable name.
var envRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func envOf(name string) string {
	if kindOf(name) != credapi.KindGeneric || !envRE.MatchString(name) {
		return ""
	}
	return name
}
