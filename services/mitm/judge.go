package mitm

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/mitm/internal/http1"
)

// verdict is a refusal: the status, the audit rule and the one-line reason.
type verdict struct {
	status int
	rule   string
	reason string
}

// judge decides one request inside a tunnel and, when it is allowed, swaps its credential. The
// checks run in this order: host on the allowlist, Host header equals the tunnel's host, no
// placeholder bound elsewhere, the request policy, then the credential swap. nil allows.
func (p *Proxy) judge(rs *reqState) *verdict {
	sess, req := rs.sess, rs.req
	sb := sess.sb
	if req.Method == http.MethodConnect {
		return &verdict{http.StatusMethodNotAllowed, RuleBadRequest, "nexus: refused: CONNECT inside a tunnel (open a new connection to the other host instead)"}
	}
	if !sess.allowed {
		return &verdict{http.StatusForbidden, RuleHostNotAllowed, notAllowedReason(sess.host)}
	}
	// The Host field as the guest's client writes it is the tunnel's host itself: nothing to
	// normalise.
	if req.Host != sess.host || req.URL.Host != "" {
		if h, ok := requestHost(req.Host, req.URL.Host, sess.port); !ok || h != sess.host {
			return &verdict{http.StatusForbidden, RuleHostMismatch, mismatchReason(h, sess.host)}
		}
	}
	use := scanPlaceholders(sb, req, sess.host)
	if use.leak {
		return leakVerdict(sess.host)
	}
	if req.Chunks != nil {
		// Trailer fields come after the body: they are looked at when they arrive.
		req.Chunks.Check = func(tr *http1.Head) error {
			if trailerLeaks(sb, tr, sess.host) {
				return errTrailerLeak
			}
			return nil
		}
	}
	if sb.Policy != nil {
		hr := req.HTTPRequest()
		v := sb.Policy.Decide(hr, sess.host)
		req.Body = bodyOf(hr) // the policy may have read part of it and put it back
		if v.Deny {
			rule := v.Rule
			if rule == "" {
				rule = "http_policy"
			}
			reason := errdefs.FirstLine(v.Reason)
			if reason == "" {
				reason = fmt.Sprintf("nexus: refused: %s %s is not allowed by this sandbox's request policy for %s", req.Method, rs.path, sess.host)
			}
			return &verdict{http.StatusForbidden, rule, reason}
		}
		rs.rule = v.Rule
		if v.StripCredential && (use.bearer != "" || use.basicPass != "") {
			rs.rewrite.DropAuthorization = true
			use.bearer, use.basicPass = "", ""
		}
	}
	if use.bearer != "" || use.basicPass != "" {
		placeholder := use.bearer
		if placeholder == "" {
			placeholder = use.basicPass
		}
		secret, err := p.resolve(context.Background(), sb, sess.host, placeholder)
		if err != nil {
			if errors.Is(err, errdefs.ErrRefused) {
				return &verdict{http.StatusForbidden, RuleCredRefused, fmt.Sprintf(
					"nexus: refused: the credential bound to %s was not released for this sandbox (recreate the sandbox to pick up the current secret)", sess.host)}
			}
			p.log.Warn().Str(logKeySandbox, sb.ID).Str(logKeyHost, sess.host).Str("error", redactHex64(err.Error())).Msg("credential resolve failed")
			return &verdict{http.StatusBadGateway, RuleCredUnavailable, fmt.Sprintf(
				"nexus: the credential for %s is unavailable right now (check `nexus secret ls` and that credbroker is running)", sess.host)}
		}
		if !http1.ValidFieldValue(secret) {
			p.log.Warn().Str(logKeySandbox, sb.ID).Str(logKeyHost, sess.host).Msg("credential holds a control character (a line break?): not sent")
			return &verdict{http.StatusBadGateway, RuleCredUnavailable, fmt.Sprintf(
				"nexus: the credential for %s is not a valid header value (set it again without line breaks: `nexus secret set`)", sess.host)}
		}
		if use.bearer != "" {
			rs.rewrite.Authorization = "Bearer " + secret
		} else {
			rs.rewrite.Authorization = "Basic " + base64.StdEncoding.EncodeToString([]byte(use.basicUser+":"+secret))
		}
		rs.swapped = true
	}
	if req.Body != nil {
		rs.reqBody = countingBody{r: req.Body}
		req.Body = &rs.reqBody
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

func leakVerdict(host string) *verdict {
	return &verdict{http.StatusForbidden, RulePlaceholderLeak, fmt.Sprintf(
		"nexus: refused: a nexus credential placeholder was sent to %s, which it is not bound to (bind the secret to that host with --secret NAME@%s or egress.secrets[].hosts in .nexus/config.yaml)",
		host, host)}
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
