package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
	"github.com/IniZio/nexus/pkg/policy"
)

// MaxExplainBody bounds the body of an explained request.
const MaxExplainBody = 1 << 20

// branchLabel names the branch of a worktree-bound sandbox (set by the worktree delegation);
// its pushes are held to that branch alone, over HTTPS as over the git SSH relay.
const branchLabel = "nexus.branch"

// requestPolicy is the request policy of a recorded sandbox: its --repo bindings, the
// egress.policy of its .nexus/config.yaml and its allowed branches. The mitm compiles the same
// value.
func requestPolicy(sb *api.Sandbox) httppolicy.Policy {
	p := sb.Config.HTTPPolicy(sb.Egress.Repos)
	if b := sb.Labels[branchLabel]; b != "" {
		if !strings.HasPrefix(b, "refs/") {
			b = "refs/heads/" + b
		}
		p.Branches = []string{b}
	}
	return p
}

// egressExplain serves `nexus egress explain`.
func (g *Service) egressExplain(ctx context.Context, r api.ExplainRequest) (api.Explanation, error) {
	name, err := api.ParseName(r.Name)
	if err != nil {
		return api.Explanation{}, err
	}
	sb, err := g.reg.Get(ctx, name)
	if err != nil {
		return api.Explanation{}, err
	}
	return explain(sb, r, time.Now())
}

// explain judges a request the way the perimeter would (mode, host allowlist, request policy)
// without sending anything.
func explain(sb *api.Sandbox, r api.ExplainRequest, now time.Time) (api.Explanation, error) {
	method := strings.ToUpper(r.Method)
	if method == "" || len(method) > 16 || strings.IndexFunc(method, func(c rune) bool { return c < 'A' || c > 'Z' }) >= 0 {
		return api.Explanation{}, errdefs.Invalid("egress explain: %q is not an HTTP method", clipArg(r.Method))
	}
	if len(r.URL) > 8192 || len(r.Body) > MaxExplainBody {
		return api.Explanation{}, errdefs.Invalid("egress explain: the URL or body is too large")
	}
	u, err := url.Parse(r.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" {
		return api.Explanation{}, errdefs.Invalid("egress explain: %q is not an absolute http(s) URL", clipArg(r.URL))
	}
	host, err := policy.NormalizeHost(u.Hostname())
	if err != nil {
		return api.Explanation{}, errdefs.Invalid("egress explain: %v", err)
	}
	port := 443
	if u.Scheme == "http" {
		port = 80
	}
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return api.Explanation{}, errdefs.Invalid("egress explain: bad port %q", clipArg(p))
		}
	}
	ex := api.Explanation{Sandbox: sb.Name, Method: method, URL: u.String(), Host: host, Port: port}
	decide := func(allow bool, layer, rule, reason string) api.Explanation {
		ex.Decision, ex.Layer, ex.Rule, ex.Reason = "deny", layer, rule, reason
		if allow {
			ex.Decision = "allow"
		}
		return ex
	}
	switch sb.Egress.Mode {
	case api.EgressNone:
		return decide(false, "mode", "egress_none", fmt.Sprintf("nexus: refused: sandbox %s has egress none; no packet leaves it", sb.Name)), nil
	case api.EgressAllowAll:
		if now.Before(sb.Egress.AllowAllUntil) {
			return decide(true, "mode", "allow_all", fmt.Sprintf("egress allow-all until %s: no MITM and no request policy", sb.Egress.AllowAllUntil.UTC().Format(time.RFC3339))), nil
		}
		return decide(false, "mode", "allow_all_expired", fmt.Sprintf("nexus: refused: allow-all egress of %s expired at %s; the sandbox is default-deny",
			sb.Name, sb.Egress.AllowAllUntil.UTC().Format(time.RFC3339))), nil
	}
	rules, deny, err := liveAllowlist(sb.Egress, now)
	if err != nil {
		return api.Explanation{}, errdefs.Invalid("sandbox %s: recorded allowlist: %v", sb.Name, err)
	}
	allow, err := policy.NewAllowlist(rules)
	if err == nil {
		allow, err = allow.WithDeny(deny)
	}
	if err != nil {
		return api.Explanation{}, errdefs.Invalid("sandbox %s: recorded allowlist: %v", sb.Name, err)
	}
	if d, denied := allow.Denied(host); denied {
		return decide(false, "host", policy.RuleDenied, fmt.Sprintf("nexus: refused: host %s is denied on this sandbox (%s, lift it with nexus egress revoke %s %s)", host, d, sb.Name, d)), nil
	}
	rule, ok := allow.Match(host, port)
	if !ok {
		return decide(false, "host", "host_not_allowed", fmt.Sprintf("nexus: refused: host %s is not in this sandbox's allowlist (add it with --allow-host %s or egress.allow in .nexus/config.yaml)", host, host)), nil
	}
	pol := requestPolicy(sb)
	ex.Policy = &pol
	eng, err := httppolicy.New(pol)
	if err != nil {
		return api.Explanation{}, errdefs.Invalid("sandbox %s: recorded request policy: %v", sb.Name, err)
	}
	var body io.Reader
	if r.Body != "" {
		body = strings.NewReader(r.Body)
	}
	req, err := http.NewRequest(method, u.String(), body)
	if err != nil {
		return api.Explanation{}, errdefs.Invalid("egress explain: %v", err)
	}
	d := eng.Decide(req, host)
	if d.Rule == httppolicy.RuleOpenHost {
		d.Reason = fmt.Sprintf("%s is open: allowed by %s, no request policy gates it", host, rule)
	}
	out := decide(d.Allow, "request", d.Rule, d.Reason)
	if d.Allow {
		switch {
		case d.StripCredential:
			out.Credential = "stripped"
		default:
			for _, s := range sb.Secrets {
				if slices.Contains(s.Hosts, host) {
					out.Credential = "swapped " + s.Name
					break
				}
			}
		}
	}
	return out, nil
}

func clipArg(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
