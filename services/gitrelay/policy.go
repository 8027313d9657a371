package gitrelay

import (
	"fmt"
	"slices"
	"strings"

	gwapi "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
)

// BranchLabel is the sandbox label naming the branch of a worktree-bound sandbox (set by the
// worktree delegation): its pushes are held to that branch alone.
const BranchLabel = "nexus.branch"

// Policy is what a sandbox's git over SSH is held to.
type Policy struct {
	// Repos are the owner/repo bound with --repo (github.com).
	Repos []string
	// Hosts are the egress.policy entries of .nexus/config.yaml.
	Hosts []httppolicy.HostRules
	// Branches are the ref patterns a push may update.
	Branches []string

	engine *httppolicy.Engine
}

// PolicyOf derives the policy of a sandbox record: its --repo bindings, its config's
// egress.policy, and its allowed branches (refs/heads/<nexus.branch label> for a worktree-bound
// sandbox, otherwise httppolicy.DefaultBranches). A sandbox with egress none gets no repos.
func PolicyOf(rec *gwapi.Sandbox) (*Policy, error) {
	p := &Policy{}
	if rec.Egress.Mode != gwapi.EgressNone {
		p.Repos = rec.Egress.Repos
		if rec.Config != nil {
			p.Hosts = rec.Config.Egress.Policy
		}
	}
	if b := rec.Labels[BranchLabel]; b != "" {
		if !strings.HasPrefix(b, "refs/") {
			b = "refs/heads/" + b
		}
		p.Branches = []string{b}
	}
	return p, p.compile()
}

func (p *Policy) compile() error {
	if len(p.Branches) == 0 {
		p.Branches = httppolicy.DefaultBranches
	}
	e, err := httppolicy.New(httppolicy.Policy{Repos: p.Repos, Hosts: p.Hosts, Branches: p.Branches})
	if err != nil {
		return fmt.Errorf("gitrelay: sandbox policy: %w", err)
	}
	p.engine = e
	return nil
}

// RepoAllowed reports whether host/repo (lower case) may be fetched from and pushed to: a repo
// bound with --repo on github.com, or listed under the host's egress.policy repos.
func (p *Policy) RepoAllowed(host, repo string) bool {
	if host == httppolicy.GitHubWeb {
		for _, r := range p.Repos {
			if pr, ok := httppolicy.ParseRepo(r); ok && pr == repo {
				return true
			}
		}
	}
	for _, h := range p.Hosts {
		if !strings.EqualFold(h.Host, host) {
			continue
		}
		if slices.ContainsFunc(h.Repos, func(r string) bool { pr, ok := httppolicy.ParseRepo(r); return ok && pr == repo }) {
			return true
		}
	}
	return false
}

// BranchAllowed reports whether a push may update ref.
func (p *Policy) BranchAllowed(ref string) bool { return p.engine.BranchAllowed(ref) }

// RepoRefusal is the refusal of a repo outside the policy, word for word as the spec gives it.
func RepoRefusal(host, repo string) error {
	return errdefs.Refused("nexus: refused by egress policy: %s %s not in .nexus/config.yaml egress.policy", host, repo)
}

// RefRefusal is the refusal of a push to a ref outside the allowed branches, word for word.
func RefRefusal(ref string) error {
	return errdefs.Refused("nexus: refused: ref %s not in allowed branches", ref)
}
