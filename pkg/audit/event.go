// Package audit defines the one egress-decision event every perimeter layer emits (DESIGN §5).
//
// An Event is the canonical line for a decision: it is published with JetStream ack on
// nexus.audit.<service>.<sandbox id> and read back by `nexus audit tail`. It never carries a
// secret or a placeholder value: Swapped says that a credential was swapped, never what it was.
//
// The write path is limited per sandbox (limits.go): identical decisions are folded into one
// event with a Count, a sandbox over its rate gets a `suppressed` summary instead of its events,
// and the stream keeps the last events of every subject whatever the others write.
package audit

import (
	"context"
	"strings"
	"time"
)

// Layers of the perimeter that make decisions.
const (
	LayerDNS  = "dns"
	LayerL4   = "l4"
	LayerTLS  = "tls"
	LayerHTTP = "http"
	LayerCred = "cred"
	LayerGit  = "git"
	// LayerPolicy is a change of a sandbox's policy (`nexus egress allow|revoke|deny|apply`, a
	// grant's expiry): By, Before and After say who changed what.
	LayerPolicy = "policy"
	// LayerAudit is the audit write path itself: the `suppressed` summaries.
	LayerAudit = "audit"
	// LayerAPI is a request to the remote API (`nexus serve api`), not an egress decision:
	// Token names the API token, Method, Path and Status the request, Rule the route it
	// matched, IP the client. Its events live apart, on nexus.audit.api.<token> (APISubject),
	// where the readers of egress decisions do not look (TailOptions.API).
	LayerAPI = "api"
)

// RuleSuppressed is the rule of a summary event: Count events of the sandbox over its audit
// rate were not recorded one by one between First and Last.
const RuleSuppressed = "suppressed"

// Decisions.
const (
	Allow = "allow"
	Deny  = "deny"
)

// Event is one decision.
type Event struct {
	Time     time.Time `json:"time"`
	Sandbox  string    `json:"sandbox"`                // the sandbox id
	Name     string    `json:"sandbox_name,omitempty"` // its name, for people (names are reused after rm)
	Layer    string    `json:"layer"`
	Proto    string    `json:"proto,omitempty"` // tcp, udp, icmp
	Host     string    `json:"host,omitempty"`
	IP       string    `json:"ip,omitempty"`
	Port     int       `json:"port,omitempty"`
	Method   string    `json:"method,omitempty"`
	Path     string    `json:"path,omitempty"`
	Status   int       `json:"status,omitempty"`
	Bytes    int64     `json:"bytes,omitempty"`
	Decision string    `json:"decision"`
	Rule     string    `json:"rule,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Swapped  bool      `json:"swapped,omitempty"`
	// By, Before and After describe a policy change (layer policy): who made it and the
	// effective allowlist and denies before and after it (space-separated rules, denies as
	// "!host"; "-" for none).
	By     string `json:"by,omitempty"`
	Before string `json:"before,omitempty"`
	After  string `json:"after,omitempty"`
	// Token is the name (never the secret) of the API token of a request (layer api); empty
	// when the request had no valid token.
	Token string `json:"token,omitempty"`
	// Count > 1: this event stands for Count identical decisions (or, with rule suppressed,
	// Count decisions not recorded one by one) made between First and Last.
	Count int64      `json:"count,omitempty"`
	First *time.Time `json:"first,omitempty"`
	Last  *time.Time `json:"last,omitempty"`
}

// Sink receives events. Implementations must not block the caller's data path for long: the
// JetStream sink publishes asynchronously and tracks acks.
type Sink interface {
	Emit(ctx context.Context, ev Event)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(ctx context.Context, ev Event)

func (f SinkFunc) Emit(ctx context.Context, ev Event) { f(ctx, ev) }

// Prefix is the root of every audit subject; the stream NEXUS_AUDIT holds Prefix.>.
const Prefix = "nexus.audit"

// LegacyService is the service token of the subjects before per-service audit subjects
// (nexus.audit.egress.<sandbox>): events stored then stay readable, and a spool written by an
// older build is republished under the service's own prefix.
const LegacyService = "egress"

// Subject is the bus subject of a service's events about a sandbox: nexus.audit.<service>.<id>.
// A service may publish only under its own nexus.audit.<service>.> (pkg/bus/users.go).
func Subject(service, sandboxID string) string {
	return Prefix + "." + subjectToken(service) + "." + subjectToken(sandboxID)
}

// SuppressedSubject is where a service's `suppressed` summaries about a sandbox go: beside its
// events (the same service prefix and sandbox), on their own subject, so that the gateway finds
// the last one at once (`nexus ps` flags a sandbox that keeps hitting its limit).
func SuppressedSubject(service, sandboxID string) string {
	return Subject(service, sandboxID) + "." + RuleSuppressed
}

// APIService is the service token of the remote API's request events.
const APIService = "api"

// APISubjects selects every API request event.
const APISubjects = Prefix + "." + APIService + ".>"

// APIKey is the last token of the subject of a request made with the API token named token
// (nexus.audit.api.token-<name>; nexus.audit.api.anonymous without a valid one): one subject per
// token, so that the stream's per-subject limit keeps each token's last requests whatever another
// sends, and never a sandbox id (sb-…), so that a sandbox's filters never select it.
func APIKey(token string) string {
	if token == "" {
		return "anonymous"
	}
	return subjectToken("token-" + token)
}

// IsAPISubject reports whether subject holds API request events rather than egress decisions.
func IsAPISubject(subject string) bool {
	return strings.HasPrefix(subject, Prefix+"."+APIService+".")
}

// SandboxSubjects are the filters that select every audit event of a sandbox, whatever service
// wrote it and including the legacy nexus.audit.egress.<id>.
func SandboxSubjects(sandboxID string) []string {
	s := Prefix + ".*." + subjectToken(sandboxID)
	return []string{s, s + ".>"}
}

// AllSuppressed selects every `suppressed` summary.
const AllSuppressed = Prefix + ".*.*." + RuleSuppressed

// SandboxOfSubject returns the sandbox id of an audit subject ("" when it is not one).
func SandboxOfSubject(subject string) string {
	t := strings.Split(subject, ".")
	if len(t) < 4 || t[0]+"."+t[1] != Prefix {
		return ""
	}
	return t[3]
}

// subjectToken keeps a subject token free of separators and wildcards.
func subjectToken(s string) string {
	if s == "" {
		return "unknown"
	}
	b := []byte(s)
	for i, c := range b {
		switch c {
		case '.', '*', '>', ' ', '\t', '\r', '\n', '/':
			b[i] = '_'
		}
	}
	return string(b)
}
