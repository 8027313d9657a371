package mitm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/mitm/internal/http1"
)

// The decision on a request inside a tunnel is an ordered list of named checks. Each check
// refuses the request (a verdict) or lets it go on to the next; the first refusal answers it.
// A check's name is the audit rule of its refusals (a request policy names finer ones; a
// credential that cannot be had right now is cred_unavailable). A request all checks let pass
// is forwarded as they left it: its credential swapped, or dropped by the policy.

// check is one question asked of every request.
type check struct {
	name string
	run  func(p *Proxy, rs *reqState) *verdict
}

// checks, in the order they are asked.
var checks = [...]check{
	{RuleBadRequest, checkMethod},              // CONNECT is for the netstack, not inside a tunnel
	{RuleHostNotAllowed, checkHost},            // the tunnel's host (the TLS server name) is allowed
	{RuleHostMismatch, checkHostField},         // the Host field and target name that host
	{RulePlaceholderCleartext, checkCleartext}, // no placeholder at all on a cleartext upstream leg
	{RulePlaceholderLeak, checkPlaceholders},   // no placeholder of the sandbox bound elsewhere
	{RuleHTTPPolicy, checkPolicy},              // the sandbox's request policy
	{RuleCredRefused, checkSwap},               // the bound placeholder swapped for its credential
}

// verdict is a refusal: the status, the audit rule and the one-line reason.
type verdict struct {
	status int
	rule   string
	reason string
}

// judge asks the checks in order. nil allows the request, whose body (if any) is counted from
// here on for its audit event.
func (p *Proxy) judge(rs *reqState) *verdict {
	for i := range checks {
		if v := checks[i].run(p, rs); v != nil {
			if v.rule == "" {
				v.rule = checks[i].name
			}
			return v
		}
	}
	if req := rs.req; req.Body != nil {
		rs.reqBody = countingBody{r: req.Body}
		req.Body = &rs.reqBody
	}
	return nil
}

func checkMethod(_ *Proxy, rs *reqState) *verdict {
	if rs.req.Method != http.MethodConnect {
		return nil
	}
	return &verdict{status: http.StatusMethodNotAllowed,
		reason: "nexus: refused: CONNECT inside a tunnel (open a new connection to the other host instead)"}
}

func checkHost(_ *Proxy, rs *reqState) *verdict {
	if rs.sess.allowed {
		return nil
	}
	return &verdict{status: http.StatusForbidden, reason: notAllowedReason(rs.sess.host)}
}

func checkHostField(_ *Proxy, rs *reqState) *verdict {
	req, sess := rs.req, rs.sess
	// The Host field as the guest's client writes it is the tunnel's host itself: nothing to
	// normalise.
	if req.Host == sess.host && req.URL.Host == "" {
		return nil
	}
	if h, ok := requestHost(req.Host, req.URL.Host, sess.port); !ok || h != sess.host {
		return &verdict{status: http.StatusForbidden, reason: mismatchReason(h, sess.host)}
	}
	return nil
}

// checkCleartext scans the request's head for the sandbox's placeholders (scan.go) and refuses
// any of them on a cleartext upstream leg: there the credential cannot be swapped (the real one
// would cross the network in clear), and the placeholder is not sent either.
func checkCleartext(_ *Proxy, rs *reqState) *verdict {
	rs.use = scanPlaceholders(&rs.forms, rs.sess.sb, rs.req, rs.sess.host)
	if rs.use.found && !rs.sess.upstreamTLS() {
		return cleartextVerdict(rs.sess.host)
	}
	return nil
}

// checkPlaceholders refuses a placeholder bound elsewhere found in the head, and has the body
// and the trailer fields scanned as they are forwarded: a refusal found there cuts the request
// short (forward answers it).
func checkPlaceholders(_ *Proxy, rs *reqState) *verdict {
	sb, host, req := rs.sess.sb, rs.sess.host, rs.req
	if rs.use.leak {
		return leakVerdict(host)
	}
	rs.rewrite.CredentialHeader = rs.use.header // where a swap or a strip acts
	if len(sb.creds) == 0 {
		return nil
	}
	cleartext := !rs.sess.upstreamTLS()
	if req.Body != nil {
		if v := rs.scanBody(cleartext); v != nil {
			return v
		}
	}
	if c := req.Chunks; c != nil {
		// Trailer fields come after the body: they are looked at when they arrive.
		c.Check = func(tr *http1.Head) error {
			if rule := trailerRefusal(&rs.forms, sb, tr, host, cleartext); rule != "" {
				return &placeholderError{rule: rule}
			}
			return nil
		}
	}
	return nil
}

// checkPolicy runs the sandbox's request policy, written against net/http: only for a sandbox
// that has one is the request rebuilt as a net/http.Request (and its body taken back from it).
func checkPolicy(_ *Proxy, rs *reqState) *verdict {
	sb, req := rs.sess.sb, rs.req
	if sb.Policy == nil {
		return nil
	}
	hr := req.HTTPRequest()
	v := sb.Policy.Decide(hr, rs.sess.host)
	req.Body = bodyOf(hr) // the policy may have read part of it and put it back
	// What it read of the body went through the scan: a placeholder found there is the refusal.
	if rule := rs.bodyRefusal(); rule != "" {
		return placeholderVerdict(rule, rs.sess.host)
	}
	if v.Deny {
		reason := errdefs.FirstLine(v.Reason)
		if reason == "" {
			reason = fmt.Sprintf("nexus: refused: %s %s is not allowed by this sandbox's request policy for %s", req.Method, rs.path, rs.sess.host)
		}
		return &verdict{status: http.StatusForbidden, rule: v.Rule, reason: reason}
	}
	rs.rule = v.Rule
	if v.StripCredential && (rs.use.bearer != "" || rs.use.basicPass != "") {
		rs.rewrite.DropAuthorization = true
		rs.use.bearer, rs.use.basicPass = "", ""
	}
	return nil
}

// bodyOf is the body a policy left on hr (nil for none).
func bodyOf(hr *http.Request) io.Reader {
	if hr.Body == nil || hr.Body == http.NoBody {
		return nil
	}
	return hr.Body
}

func checkSwap(p *Proxy, rs *reqState) *verdict {
	use := &rs.use
	placeholder := use.bearer
	if placeholder == "" {
		placeholder = use.basicPass
	}
	if placeholder == "" {
		return nil
	}
	sb, host := rs.sess.sb, rs.sess.host
	// A real credential goes upstream only inside TLS (checkCleartext refused this already).
	if !rs.sess.upstreamTLS() {
		return cleartextVerdict(host)
	}
	secret, err := p.resolve(context.Background(), sb, host, placeholder)
	if err != nil {
		if errors.Is(err, errdefs.ErrRefused) {
			return &verdict{status: http.StatusForbidden, reason: fmt.Sprintf(
				"nexus: refused: the credential bound to %s was not released for this sandbox (recreate the sandbox to pick up the current secret)", host)}
		}
		p.log.Warn().Str(logKeySandbox, sb.ID).Str(logKeyHost, host).Str("error", redactHex64(err.Error())).Msg("credential resolve failed")
		return &verdict{status: http.StatusBadGateway, rule: RuleCredUnavailable, reason: fmt.Sprintf(
			"nexus: the credential for %s is unavailable right now (check `nexus secret ls` and that credbroker is running)", host)}
	}
	if !http1.ValidFieldValue(secret) {
		p.log.Warn().Str(logKeySandbox, sb.ID).Str(logKeyHost, host).Msg("credential holds a control character (a line break?): not sent")
		return &verdict{status: http.StatusBadGateway, rule: RuleCredUnavailable, reason: fmt.Sprintf(
			"nexus: the credential for %s is not a valid header value (set it again without line breaks: `nexus secret set`)", host)}
	}
	rs.rewrite.Authorization = use.swappedCredential(secret)
	rs.swapped = true
	return nil
}

func leakVerdict(host string) *verdict {
	return &verdict{http.StatusForbidden, RulePlaceholderLeak, fmt.Sprintf(
		"nexus: refused: a nexus credential placeholder was sent to %s, which it is not bound to (bind the secret to that host with --secret NAME@%s or egress.secrets[].hosts in .nexus/config.yaml)",
		host, host)}
}

func cleartextVerdict(host string) *verdict {
	return &verdict{http.StatusForbidden, RulePlaceholderCleartext, fmt.Sprintf(
		"nexus: refused: a nexus credential placeholder was sent to %s over plain HTTP; credentials are sent only over TLS (use https://%s)",
		host, host)}
}

// placeholderVerdict is the refusal a placeholder found in a body or trailer stands for.
func placeholderVerdict(rule, host string) *verdict {
	if rule == RulePlaceholderCleartext {
		return cleartextVerdict(host)
	}
	return leakVerdict(host)
}

// requestHost is the host a request names: its Host field and, when the request line carries an
// absolute URL, that URL's host; both must agree. Ports other than the tunnel's are a mismatch
// too.
func requestHost(hostField, urlHost, tunnelPort string) (string, bool) {
	var out string
	for _, hp := range [2]string{urlHost, hostField} {
		if hp == "" {
			continue
		}
		h, port, err := splitHostPort(hp, tunnelPort)
		if err != nil {
			return safeHost(hp), false
		}
		if port != tunnelPort {
			return h + ":" + port, false
		}
		if out != "" && h != out {
			return h, false
		}
		out = h
	}
	return out, out != ""
}

func notAllowedReason(host string) string {
	return fmt.Sprintf("nexus: refused: host %s is not in this sandbox's allowlist (add it with --allow-host %s or egress.allow in .nexus/config.yaml)", host, host)
}

func mismatchReason(got, tunnel string) string {
	if got == "" {
		got = "(none)"
	}
	return fmt.Sprintf("nexus: refused: Host %s does not match the TLS server name %s; one connection serves one host (open a new connection to %s; it must be allowed with --allow-host or egress.allow in .nexus/config.yaml)",
		got, tunnel, got)
}
