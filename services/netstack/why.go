package netstack

import (
	"fmt"
	"net/http"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/netaddr"
	"github.com/IniZio/nexus/pkg/policy"
)

// nexus-why (issue 26): the guest's nexus-why reaches the host over its agent channel; the
// gateway reads the sandbox's recent refusals from the audit stream (every layer: this
// netstack's DNS, connection and SNI ones, the mitm's HTTP ones, the git relay's) and asks this
// netstack, which holds the sandbox's live policy, what would allow each, or to judge a request.

// Why answers one nexus-why call for the network of id (netapi.Why).
func (s *Manager) Why(id string, r netstackapi.WhyRequest) (netstackapi.WhyReply, error) {
	n, err := s.get(id)
	if err != nil {
		return netstackapi.WhyReply{}, err
	}
	if r.Request != nil {
		status, msg := n.whyRequest(*r.Request)
		return netstackapi.WhyReply{Status: status, Message: msg}, nil
	}
	denials := r.Denials
	if len(denials) > netstackapi.MaxWhyDenials {
		denials = denials[len(denials)-netstackapi.MaxWhyDenials:]
	}
	rep := n.whyReport(denials)
	return netstackapi.WhyReply{Status: http.StatusOK, Report: &rep}, nil
}

// whyReport is the network's mode and what would allow each of denials.
func (n *network) whyReport(denials []audit.Event) agentproto.WhyReport {
	pol, _ := n.policy()
	rep := agentproto.WhyReport{Sandbox: n.name, Mode: effectiveMode(pol, time.Now()), Ask: pol.Ask, Denials: []agentproto.WhyDenial{}}
	for _, ev := range denials {
		rep.Denials = append(rep.Denials, agentproto.WhyDenial{Time: ev.Time, Layer: ev.Layer, Proto: ev.Proto, Host: ev.Host, IP: ev.IP,
			Port: ev.Port, Method: ev.Method, Path: ev.Path, Rule: ev.Rule, Reason: ev.Reason, Fix: n.fixFor(ev, pol)})
	}
	return rep
}

// Rules of the mitm and the git relay that nexus-why explains (their audit rule names).
const (
	ruleHostMismatch  = "host_mismatch"
	ruleSNIMismatch   = "sni_mismatch"
	rulePlaceholder   = "placeholder_leak"
	ruleCleartext     = "placeholder_cleartext"
	ruleCredRefused   = "cred_refused"
	ruleCredMissing   = "cred_unavailable"
	ruleUpstreamError = "upstream_error"
	ruleBadRequest    = "bad_request"
	ruleHeadTooLarge  = "request_head_too_large"
	ruleHostNotAllow  = "host_not_allowed"
)

// fixFor says what would allow a refused ev: the owner's command or config key, or a request.
func (n *network) fixFor(ev audit.Event, pol Policy) string {
	target, port, dns := ev.Host, ev.Port, ev.Layer == audit.LayerDNS
	if dns {
		port = 0 // a name: every port of it is asked for with the name
	}
	if target == "" {
		target = ev.IP
	}
	if port != 0 && port != 443 && port != 80 {
		target = fmt.Sprintf("%s:%d", target, port)
	}
	apply := "in .nexus/config.yaml and its owner runs `nexus egress apply " + n.name + "`"
	switch {
	case pol.Mode == netstackapi.ModeNone:
		return "the sandbox has egress none; its owner creates it again with --allow-host"
	case ev.Rule == RuleMaxConns || ev.Rule == RuleConnRate || ev.Rule == RuleDNSRate:
		return "a limit (egress.limits in .nexus/config.yaml): slow down or open fewer connections"
	case ev.Rule == RuleAllowAllExpired:
		return "the allow-all window ended; its owner runs `nexus egress allow " + n.name + " HOST` for what is still needed"
	case ev.Rule == policy.RuleDenied:
		return "the owner denied " + ev.Host + "; only they lift it: `nexus egress revoke " + n.name + " " + ev.Host + "`"
	case ev.Rule == netaddr.Rule:
		return "a private or host address; it opens only with --allow-private at create"
	case ev.Rule == rulePlaceholder || ev.Rule == ruleCleartext:
		return "nothing: a credential placeholder goes only to the hosts its secret is bound to, over https"
	case ev.Rule == ruleHostMismatch || ev.Rule == ruleSNIMismatch:
		return "nothing: the Host header must name the host the TLS connection was made to"
	case ev.Rule == ruleCredRefused || ev.Rule == ruleCredMissing:
		return "the credential for " + ev.Host + " is not there: its owner sets it with `nexus secret set NAME`"
	case ev.Rule == ruleBadRequest || ev.Rule == ruleHeadTooLarge || ev.Rule == ruleUpstreamError:
		return "not a policy refusal: send a well-formed request (or the upstream failed); try again"
	case ev.Layer == audit.LayerGit:
		return "the git relay's policy (--repo, egress.policy " + apply + ")"
	case ev.Layer == audit.LayerHTTP && ev.Rule != ruleHostNotAllow:
		return "the request policy refuses it: egress.policy (or --repo) " + apply
	case target == "" || (dns && ev.IP != "" && ev.IP != GatewayIP) || (!dns && (ev.IP == GatewayIP || ev.Port == 53)):
		return "use the gateway resolver " + GatewayIP + " and names, not addresses"
	}
	fix := "its owner runs `nexus egress allow " + n.name + " " + target + "` (or adds it to egress.allow " + apply + ")"
	if pol.Ask {
		fix += "; or ask: `nexus-why request " + target + " \"why you need it\"`"
	}
	return fix
}

// whyRequest judges a guest's request for a host and, in ask mode, files it; it returns an
// HTTP-like status and the line the guest sees.
func (n *network) whyRequest(req agentproto.WhyRequest) (int, string) {
	host, err := policy.NormalizeHost(req.Host)
	if err != nil || req.Port < 0 || req.Port > 65535 {
		return http.StatusBadRequest, "not a host[:port] to request"
	}
	pol, allow := n.policy()
	want := host
	if req.Port != 0 {
		want = fmt.Sprintf("%s:%d", host, req.Port)
	}
	_, allowed := allow.MatchName(host)
	if req.Port != 0 {
		_, allowed = allow.Match(host, req.Port)
	}
	switch _, denied := allow.Denied(host); {
	case allowed:
		return http.StatusOK, want + " is allowed already"
	case denied:
		return http.StatusForbidden, host + " is denied by the sandbox's owner; a request cannot lift that"
	case !pol.Ask || effectiveMode(pol, time.Now()) != netstackapi.ModeCurated:
		return http.StatusConflict, "this sandbox is not in ask mode: ask its owner to run `nexus egress allow " + n.name + " " + want + "`"
	}
	if f := n.svc.cfg.OnRequest; f != nil {
		r := netstackapi.EgressRequest{SandboxID: n.id, SandboxName: n.name, Host: host, Port: req.Port, Reason: agentproto.CleanGuestText(req.Reason, agentproto.MaxWhyReason), Time: time.Now().UTC()}
		if r.Reason != "" {
			r.GuestReported = netstackapi.GuestReportedNote
		}
		f(r)
	}
	return http.StatusAccepted, "asked for " + want + ": the owner sees it with `nexus egress requests` and answers with `nexus egress approve|reject ID`"
}
