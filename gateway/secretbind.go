package gateway

import (
	"context"
	"fmt"
	"strings"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/policy"
)

// storedSecrets looks a secret up in the store: the hosts stored with it (its ceiling, empty for
// a secret stored without hosts) and whether it exists at all.
type storedSecrets func(name string) (hosts []string, ok bool)

// bindOrigin is who asks for a binding; it decides what a binding may reach (credapi.WithinHosts).
type bindOrigin int

const (
	// bindDefault is nexus's own binding (--repo's GH_TOKEN to the GitHub hosts, an agent
	// profile's secret): narrowed to the stored hosts, dropped when none is left.
	bindDefault bindOrigin = iota
	// bindUser is `nexus create --secret` typed by the user: the only binding that may send a
	// secret stored without hosts anywhere.
	bindUser
	// bindRequest is --secret of any other create (an MCP sandbox_create): within the stored
	// hosts only.
	bindRequest
	// bindConfig is .nexus/config.yaml egress.secrets (a file in a worktree the agent can
	// write): within the stored hosts only.
	bindConfig
)

// allowedHosts checks a binding of secret to hosts against the store; where names the source in
// errors ("--secret GH_TOKEN@evil.example", "egress.secrets in /p/.nexus/config.yaml"). A default
// binding gets the hosts the store allows (maybe none); any other gets all of its hosts or an
// error naming the first host it may not reach.
func (s storedSecrets) allowedHosts(origin bindOrigin, where, secret string, hosts []string) ([]string, error) {
	stored, _ := s(secret)
	var out []string
	for _, h := range hosts {
		var err error
		switch {
		case len(stored) > 0 && !credapi.WithinHosts(stored, h):
			err = credapi.OutsideHostsError(secret, h, stored)
		case len(stored) == 0 && (origin == bindRequest || origin == bindConfig):
			err = credapi.UnhostedError(secret, h)
		}
		if err == nil {
			out = append(out, h)
			continue
		}
		if origin == bindDefault {
			continue
		}
		return nil, errdefs.New(errdefs.ErrRefused, where+": "+err.Error())
	}
	return out, nil
}

// parseSecretFlag reads --secret NAME@host[,host][:header=NAME].
func parseSecretFlag(s string) (name string, hosts []string, header string, err error) {
	bad := func(format string, a ...any) error {
		return errdefs.Invalid("invalid --secret %q: %s", s, fmt.Sprintf(format, a...))
	}
	name, rest, ok := strings.Cut(s, "@")
	hostList, opts, hasOpts := strings.Cut(rest, ":")
	if !ok || name == "" || hostList == "" {
		return "", nil, "", bad("use NAME@host[,host][:header=NAME]")
	}
	for _, h := range strings.Split(hostList, ",") {
		rule, err := policy.ParseRule(h)
		if err != nil || rule.Host == "" || strings.HasPrefix(rule.Host, "*") {
			return "", nil, "", bad("%q is not a host name", h)
		}
		hosts = append(hosts, rule.Host)
	}
	if hasOpts {
		v, ok := strings.CutPrefix(opts, "header=")
		if !ok {
			return "", nil, "", bad("after the hosts only :header=NAME may follow")
		}
		if header, err = credapi.CredentialHeader(v); err != nil {
			return "", nil, "", bad("%v", err)
		}
	}
	return name, hosts, header, nil
}

// storedSecrets reads the secret store's names and hosts from credbroker once per create.
func (g *Service) storedSecrets(ctx context.Context) storedSecrets {
	list, err := g.cred().SecretList(ctx)
	return func(name string) ([]string, bool) {
		if err != nil {
			return nil, false
		}
		for _, s := range list.Secrets {
			if s.Name == name {
				return s.Hosts, true
			}
		}
		return nil, false
	}
}
