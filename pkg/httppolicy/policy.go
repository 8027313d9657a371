// Package httppolicy decides, request by request, what a sandbox may do on a policy-gated host
// (DESIGN §6): the generic `paths:` allowlists of .nexus/config.yaml egress.policy and the GitHub
// rules, which are scoped to the host whatever policy kind gates it:
//
//   - github.com: git smart-HTTP only for a bound repo, pushes held to the allowed branches by
//     reading the receive-pack ref updates; GET/HEAD of archive and release downloads of any
//     repo with the credential stripped;
//   - api.github.com: GET / and POST /graphql whose query is exactly `viewer { login }` from any
//     gated sandbox, every other GraphQL document refused; with bound repos, REST reads of them,
//     the pull-request writes (POST /repos/<o>/<r>/pulls …), public reads of other repos with
//     the credential stripped, and GET /user;
//   - uploads.github.com: release asset uploads for bound repos.
//
// A host that no policy gates is open: the engine allows every request to it (the host
// allowlist has already judged it). The mitm calls Decide for every request; `nexus egress
// explain` calls it on a request that is never sent.
package httppolicy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/pktline"
	"github.com/IniZio/nexus/pkg/policy"
)

// DefaultBranches are the refs a sandbox may push to when nothing else is configured.
var DefaultBranches = []string{"refs/heads/nexus/**"}

// Body bounds.
const (
	// MaxGraphQLBody bounds the body read to recognise the viewer probe.
	MaxGraphQLBody = 16 << 10
	// MaxPushCommands bounds the receive-pack command section buffered before a push is forwarded.
	MaxPushCommands = 1 << 20
)

// Policy is a sandbox's request policy in its wire form: what the gateway records and sends
// to the mitm.
type Policy struct {
	// Repos are the owner/repo bound with --repo: they gate every GitHub host.
	Repos []string `json:"repos,omitempty"`
	// Hosts are the egress.policy entries of .nexus/config.yaml.
	Hosts []HostRules `json:"hosts,omitempty"`
	// Branches are the ref patterns a push may update (default DefaultBranches).
	Branches []string `json:"branches,omitempty"`
}

// HostRules gates one host: repos (GitHub hosts only) and "METHOD /glob" paths rules.
type HostRules struct {
	Host  string   `json:"host"`
	Repos []string `json:"repos,omitempty"`
	Paths []string `json:"paths,omitempty"`
}

// Empty reports whether the policy gates nothing.
func (p Policy) Empty() bool { return len(p.Repos) == 0 && len(p.Hosts) == 0 }

// Rules named in decisions (the audit event's rule field).
const (
	RuleOpenHost        = "open_host"
	RuleBadPath         = "noncanonical_path"
	RuleSmartHTTP       = "github_smart_http"
	RuleForeignRepo     = "github_foreign_repo"
	RuleArtifact        = "github_artifact"
	RuleArtifactMethod  = "github_artifact_method"
	RuleAPIRoot         = "github_api_root"
	RuleGraphQLViewer   = "github_graphql_viewer"
	RuleGraphQL         = "github_graphql"
	RuleRepoREST        = "github_repo_rest"
	RuleRepoWrite       = "github_repo_write"
	RulePublicRead      = "github_public_read"
	RulePushBranch      = "push_branch"
	RuleBadPush         = "push_malformed"
	RulePath            = "policy_path"
	RuleDefaultDeny     = "policy_default_deny"
	RuleCompressedBody  = "compressed_body"
	RuleUnsupportedPush = "push_unsupported"
)

// Decision is the engine's answer for one request.
type Decision struct {
	Allow bool `json:"allow"`
	// StripCredential: forward without the guest's Authorization (no credential reaches the
	// upstream), instead of swapping its placeholder.
	StripCredential bool   `json:"strip_credential,omitempty"`
	Rule            string `json:"rule"`
	// Reason is one line: for a refusal, the 403 body the guest reads; for an allow, what matched.
	Reason string `json:"reason"`
}

type hostPolicy struct {
	repos []string
	paths []PathRule
}

// Engine is a compiled Policy; it is safe for concurrent use.
type Engine struct {
	repos    []string
	hosts    map[string]*hostPolicy
	branches []Glob
}

// New validates and compiles p.
func New(p Policy) (*Engine, error) {
	e := &Engine{hosts: map[string]*hostPolicy{}}
	for _, r := range p.Repos {
		repo, ok := ParseRepo(r)
		if !ok {
			return nil, errdefs.Invalid("repo %q: use owner/repo", clip(r))
		}
		if !slices.Contains(e.repos, repo) {
			e.repos = append(e.repos, repo)
		}
	}
	for _, h := range p.Hosts {
		host, err := policy.NormalizeHost(h.Host)
		if err != nil {
			return nil, err
		}
		if _, dup := e.hosts[host]; dup {
			return nil, errdefs.Invalid("host %s has two policies", host)
		}
		hp := &hostPolicy{}
		if len(h.Repos) > 0 && !IsGitHubHost(host) {
			return nil, errdefs.Invalid("host %s: repos rules apply to %s, %s and %s only; use paths", host, GitHubWeb, GitHubAPI, GitHubUploads)
		}
		for _, r := range h.Repos {
			repo, ok := ParseRepo(r)
			if !ok {
				return nil, errdefs.Invalid("host %s: repo %q: use owner/repo", host, clip(r))
			}
			hp.repos = append(hp.repos, repo)
		}
		for _, s := range h.Paths {
			pr, err := ParsePathRule(s)
			if err != nil {
				return nil, err
			}
			hp.paths = append(hp.paths, pr)
		}
		e.hosts[host] = hp
	}
	branches := p.Branches
	if len(branches) == 0 {
		branches = DefaultBranches
	}
	for _, b := range branches {
		g, err := ParseBranch(b)
		if err != nil {
			return nil, err
		}
		e.branches = append(e.branches, g)
	}
	return e, nil
}

// Gated reports whether requests to host are judged (a host listed in the policy, or a GitHub
// host of a sandbox bound to repos). Other hosts are open.
func (e *Engine) Gated(host string) bool {
	if _, ok := e.hosts[host]; ok {
		return true
	}
	return IsGitHubHost(host) && len(e.repos) > 0
}

// reposFor are the repos bound on a GitHub host: --repo plus that host's own repos rules.
func (e *Engine) reposFor(host string) []string {
	out := slices.Clone(e.repos)
	if hp := e.hosts[host]; hp != nil {
		for _, r := range hp.repos {
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	return out
}

// Decide judges r, sent to host (already normalized and on the sandbox's allowlist). It may read
// a bounded part of r.Body (the GraphQL probe, a push's ref updates) and then replaces r.Body with
// a reader that yields the same bytes, so an allowed request is forwarded unchanged.
func (e *Engine) Decide(r *http.Request, host string) Decision {
	host = strings.ToLower(host)
	if !e.Gated(host) {
		return Decision{Allow: true, Rule: RuleOpenHost, Reason: host + " is open (not policy-gated)"}
	}
	path, ok := canonicalPath(r)
	if !ok {
		return deny(RuleBadPath, fmt.Sprintf("nexus: refused: request path on %s is not canonical (dot segments, empty segments, encoded slashes or control characters)", host))
	}
	if IsGitHubHost(host) {
		if d, done := e.github(r, host, path); done {
			return d
		}
	}
	if hp := e.hosts[host]; hp != nil {
		for _, pr := range hp.paths {
			if pr.Match(r.Method, path) {
				return Decision{Allow: true, Rule: RulePath, Reason: fmt.Sprintf("egress.policy %s: %s", host, pr)}
			}
		}
	}
	if host == GitHubAPI {
		// A sandbox bound to repositories writing to another one: say which repositories it is
		// bound to and how to bind this one.
		if repo, _, ok := apiRepo(path); ok {
			if repos := e.reposFor(host); len(repos) > 0 && !slices.Contains(repos, repo) {
				return deny(RuleForeignRepo, fmt.Sprintf("nexus: refused: %s /repos/%s on api.github.com: this sandbox is bound to %s (bind it with --repo %s or repos under egress.policy.api.github.com in .nexus/config.yaml)",
					method(r), redactPath(repo), describeRepos(repos), redactPath(repo)))
			}
		}
	}
	return deny(RuleDefaultDeny, fmt.Sprintf("nexus: refused: %s %s on %s matches no egress.policy rule (policy-gated hosts are default-deny; add a paths rule under egress.policy.%s in .nexus/config.yaml)",
		method(r), redactPath(path), host, host))
}

// github applies the GitHub rules; done is false when the request is left to the paths rules.
func (e *Engine) github(r *http.Request, host, path string) (Decision, bool) {
	repos := e.reposFor(host)
	bound := func(repo string) bool { return slices.Contains(repos, repo) }
	switch host {
	case GitHubWeb:
		rt := parseGitHubPath(path)
		switch {
		case rt.smart != "":
			if !bound(rt.repo) {
				return deny(RuleForeignRepo, fmt.Sprintf("nexus: refused: git over HTTPS to github.com/%s is not allowed: this sandbox is bound to %s (bind it with --repo %s or repos under egress.policy.github.com in .nexus/config.yaml)",
					redactPath(rt.repo), describeRepos(repos), redactPath(rt.repo))), true
			}
			return e.smartHTTP(r, rt), true
		case rt.artifact:
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				return deny(RuleArtifactMethod, fmt.Sprintf("nexus: refused: %s on a GitHub archive or release download path; only GET and HEAD are allowed there", method(r))), true
			}
			return Decision{Allow: true, StripCredential: true, Rule: RuleArtifact,
				Reason: fmt.Sprintf("public archive/release download of %s, forwarded without credentials", redactPath(rt.repo))}, true
		}
	case GitHubAPI:
		if path == "/" && r.Method == http.MethodGet {
			return Decision{Allow: true, Rule: RuleAPIRoot, Reason: "GET / (the API root probe of gh auth status)"}, true
		}
		if isGraphQLPath(path) {
			if path == "/graphql" && r.Method == http.MethodPost && r.URL.RawQuery == "" && isIdentity(r) && viewerProbe(r) {
				return Decision{Allow: true, Rule: RuleGraphQLViewer, Reason: "POST /graphql with exactly viewer { login } (the probe of gh auth status)"}, true
			}
			return deny(RuleGraphQL, "nexus: refused: GitHub GraphQL is denied except the viewer { login } probe; use the REST API instead (for a pull request: gh api -X POST /repos/<owner>/<repo>/pulls)"), true
		}
		if len(repos) > 0 {
			if d, ok := repoREST(r, path, bound); ok {
				return d, true
			}
		}
	case GitHubUploads:
		if repo, rest, ok := apiRepo(path); ok && bound(repo) && r.Method == http.MethodPost && releaseAssets.MatchString(rest) {
			return Decision{Allow: true, Rule: RuleRepoREST, Reason: fmt.Sprintf("release asset upload to bound repo %s", repo)}, true
		}
	}
	return Decision{}, false
}

// isGraphQLPath reports whether an api.github.com path may reach the GraphQL endpoint: /graphql
// in any case, with a trailing slash, a format suffix or anything below it. All of them are held
// to the GraphQL rule, whatever paths rules the config lists.
func isGraphQLPath(path string) bool {
	first, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	first, _, _ = strings.Cut(strings.ToLower(first), ".")
	return first == "graphql"
}

// repoWrites are the REST writes a sandbox may make on a bound repo: what opening and
// discussing a pull request needs. Writes that move refs or commit (git/refs, contents, merges)
// are not among them, so the REST API cannot get around the allowed branches.
var repoWrites = []struct {
	method string
	rest   *regexp.Regexp
}{
	{http.MethodPost, regexp.MustCompile(`^pulls$`)},
	{http.MethodPatch, regexp.MustCompile(`^pulls/[0-9]{1,20}$`)},
	{http.MethodPost, regexp.MustCompile(`^pulls/[0-9]{1,20}/comments$`)},
	{http.MethodPost, regexp.MustCompile(`^issues/[0-9]{1,20}/comments$`)},
}

// userReads are the account-level reads allowed on api.github.com for a sandbox bound to repos.
var userReads = []string{"/user", "/rate_limit", "/meta"}

// repoREST is the built-in REST policy of api.github.com for a sandbox bound to repos (--repo, or
// repos under egress.policy.api.github.com): reads of bound repos with the credential, public
// reads of any other repo without it, the pull-request writes of repoWrites on bound repos, and
// a few account reads.
func repoREST(r *http.Request, path string, bound func(string) bool) (Decision, bool) {
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	repo, rest, ok := apiRepo(path)
	switch {
	case !ok:
		if read && slices.Contains(userReads, path) {
			return Decision{Allow: true, Rule: RuleRepoREST, Reason: fmt.Sprintf("account read %s", path)}, true
		}
	case bound(repo) && read:
		return Decision{Allow: true, Rule: RuleRepoREST, Reason: fmt.Sprintf("read of bound repo %s", repo)}, true
	case bound(repo):
		for _, w := range repoWrites {
			if r.Method == w.method && w.rest.MatchString(rest) {
				return Decision{Allow: true, Rule: RuleRepoREST, Reason: fmt.Sprintf("%s /repos/%s/%s on bound repo", r.Method, repo, rest)}, true
			}
		}
		return deny(RuleRepoWrite, fmt.Sprintf("nexus: refused: %s on bound repo %s is not one of the pull-request writes a sandbox may make (it may push to its allowed branches and open pull requests with POST /repos/%s/pulls)",
			method(r), repo, repo)), true
	case read:
		return Decision{Allow: true, StripCredential: true, Rule: RulePublicRead,
			Reason: fmt.Sprintf("public read of %s, forwarded without credentials", redactPath(repo))}, true
	}
	return Decision{}, false
}

var releaseAssets = regexp.MustCompile(`^releases/[0-9]{1,20}/assets$`)

// smartHTTP judges git smart-HTTP on a bound repo.
func (e *Engine) smartHTTP(r *http.Request, rt githubRoute) Decision {
	ok := func(what string) Decision {
		return Decision{Allow: true, Rule: RuleSmartHTTP, Reason: fmt.Sprintf("git %s on bound repo %s", what, rt.repo)}
	}
	switch rt.smart {
	case gitInfoRefs:
		svc := r.URL.Query().Get("service")
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && (svc == gitUploadPack || svc == gitReceivePack) {
			return ok("ref discovery (" + svc + ")")
		}
	case gitUploadPack:
		if r.Method == http.MethodPost {
			return ok("fetch")
		}
	case gitReceivePack:
		if r.Method == http.MethodPost {
			return e.push(r, rt)
		}
	}
	return deny(RuleSmartHTTP, fmt.Sprintf("nexus: refused: %s %s is not a git smart-HTTP request (dumb HTTP is not served)", method(r), rt.smart))
}

// push reads the ref updates of a receive-pack request and holds them to the allowed branches.
func (e *Engine) push(r *http.Request, rt githubRoute) Decision {
	if r.Body == nil || r.Body == http.NoBody {
		return Decision{Allow: true, Rule: RuleSmartHTTP, Reason: fmt.Sprintf("git push to bound repo %s; each ref update must match %s", rt.repo, e.branchList())}
	}
	if !isIdentity(r) {
		return deny(RuleCompressedBody, "nexus: refused: compressed push requests are not supported")
	}
	req, raw, err := pktline.ReadUpdateRequest(r.Body, pktline.Limits{MaxBytes: MaxPushCommands})
	if raw != nil {
		r.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(raw), r.Body), c: r.Body}
	}
	switch {
	case err == pktline.ErrSignedPush:
		return deny(RuleUnsupportedPush, "nexus: refused: signed pushes (git push --signed) are not supported")
	case err == pktline.ErrTooLarge:
		return deny(RuleBadPush, "nexus: refused: push updates too many refs at once")
	case err != nil:
		return deny(RuleBadPush, "nexus: refused: malformed git push request")
	}
	for _, c := range req.Commands {
		if !e.BranchAllowed(c.Ref) {
			return deny(RulePushBranch, fmt.Sprintf("nexus: refused: ref %s not in allowed branches", redactPath(c.Ref)))
		}
	}
	return Decision{Allow: true, Rule: RuleSmartHTTP, Reason: fmt.Sprintf("git push of %d ref(s) to bound repo %s within %s", len(req.Commands), rt.repo, e.branchList())}
}

// BranchAllowed reports whether a push may update ref.
func (e *Engine) BranchAllowed(ref string) bool {
	for _, g := range e.branches {
		if g.Match(ref) {
			return true
		}
	}
	return false
}

func (e *Engine) branchList() string {
	var s []string
	for _, g := range e.branches {
		s = append(s, g.String())
	}
	return strings.Join(s, ", ")
}

// viewerProbe reads a bounded body and recognises the viewer login probe; the body is put back.
func viewerProbe(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return false
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxGraphQLBody+1))
	r.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(b), r.Body), c: r.Body}
	if err != nil || len(b) > MaxGraphQLBody {
		return false
	}
	return IsViewerLoginRequest(b)
}

func isIdentity(r *http.Request) bool {
	ce := strings.TrimSpace(strings.ToLower(r.Header.Get("Content-Encoding")))
	return ce == "" || ce == "identity"
}

// replayBody yields bytes already read followed by the rest of the original body.
type replayBody struct {
	io.Reader
	c io.Closer
}

func (b *replayBody) Close() error { return b.c.Close() }

// canonicalPath is the request's decoded path when it is canonical: absolute, no dot or empty
// segments, no encoded '/' or '\', no control characters. Paths that upstreams might normalise
// differently are refused rather than guessed at.
func canonicalPath(r *http.Request) (string, bool) {
	if r.URL == nil {
		return "", false
	}
	p := r.URL.Path
	if p == "" {
		p = "/"
	}
	if !strings.HasPrefix(p, "/") || len(p) > 8192 {
		return "", false
	}
	raw := strings.ToLower(r.URL.RawPath)
	if strings.Contains(raw, "%2f") || strings.Contains(raw, "%5c") {
		return "", false
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return "", false
		}
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		if s == "." || s == ".." || (s == "" && i < len(segs)-1) {
			return "", false
		}
	}
	return p, true
}

// redactPath makes a guest path safe for a one-line reason and an audit event: bounded, and
// any long hex run (a placeholder, a token) elided.
func redactPath(p string) string {
	p = hexRun.ReplaceAllString(p, "…")
	if len(p) > 120 {
		p = p[:120] + "…"
	}
	return p
}

var hexRun = regexp.MustCompile(`[0-9a-fA-F]{32,}`)

func describeRepos(repos []string) string {
	if len(repos) == 0 {
		return "no repository"
	}
	return strings.Join(repos, ", ")
}

// method is the request's method, bounded for a one-line reason.
func method(r *http.Request) string { return clip(r.Method) }

func deny(rule, reason string) Decision { return Decision{Rule: rule, Reason: reason} }
