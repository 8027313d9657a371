package bus

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Scope is the subject space of one service's request/reply API: nexus.<name>.<verb>, or
// nexus.<name>.<host>.<verb> for a service that runs once per host.
type Scope struct {
	Name    string // the token after "nexus.": gateway, vmm, cred, …
	PerHost bool
}

// The API scopes of the nexus services. The permission table (users.go) grants them whole, so
// an endpoint declared in a scope is covered by its service's permissions.
var (
	GatewayAPI  = Scope{Name: "gateway"}
	VMMAPI      = Scope{Name: "vmm", PerHost: true}
	NetstackAPI = Scope{Name: "netstack", PerHost: true}
	MITMAPI     = Scope{Name: "mitm", PerHost: true}
	CredAPI     = Scope{Name: "cred"}
	GitrelayAPI = Scope{Name: "gitrelay", PerHost: true}
	PortfwdAPI  = Scope{Name: "portfwd", PerHost: true}
)

// Subject is the subject of verb on host; host is ignored unless the scope is per host.
func (s Scope) Subject(host, verb string) string {
	if s.PerHost {
		return "nexus." + s.Name + "." + host + "." + verb
	}
	return "nexus." + s.Name + "." + verb
}

// All matches every subject of the scope, on every host: nexus.<name>.>.
func (s Scope) All() string { return "nexus." + s.Name + ".>" }

// OnHost matches every subject of a per-host scope on host only: nexus.<name>.<host>.>. A
// host's own services serve only these (users.go), so one host's cannot answer for another's.
func (s Scope) OnHost(host string) string {
	if !s.PerHost {
		return s.All()
	}
	return "nexus." + s.Name + "." + host + ".>"
}

// Verbs the permission table names one by one (users.go); their contracts declare the
// endpoint with the same constant, so a permission cannot drift from its subject.
const (
	// CredResolveVerb is nexus.cred.resolve: only the mitm may request it.
	CredResolveVerb = "resolve"
)

// Endpoint is one request/reply verb of a service: declared once, as a value, in the
// service's pkg/api contract, and used both to serve it (Serve) and to call it (Call), so the
// request and response types of the two sides cannot disagree.
type Endpoint[Req, Resp any] struct {
	Scope Scope
	// Verb is one or more dot-separated words: "list", "sandbox.create", "snapshot.remove".
	Verb string
	// Read says the verb changes nothing, so a call whose answer was lost to a restart of the
	// service or of the bus connection is sent again (RequestAgain).
	Read bool
}

// Route is what every endpoint has whatever its types: enough to list, permit and test it.
type Route interface {
	Subject(host string) string
	Name() string
	API() Scope
}

// Subject is the endpoint's subject on host (ignored unless the scope is per host).
func (e Endpoint[Req, Resp]) Subject(host string) string { return e.Scope.Subject(host, e.Verb) }

// Name is the micro endpoint name (`nats micro info`): the verb with dashes for dots.
func (e Endpoint[Req, Resp]) Name() string { return strings.ReplaceAll(e.Verb, ".", "-") }

// API is the endpoint's scope.
func (e Endpoint[Req, Resp]) API() Scope { return e.Scope }

// Serve adds the endpoint to s, on s's host, with fn as its handler (see handle).
func (e Endpoint[Req, Resp]) Serve(s *Service, fn func(ctx context.Context, req Req) (Resp, error)) error {
	return handle(s, e.Name(), e.Subject(s.info.Host), fn)
}

// Call sends req to the endpoint on host and decodes the reply (see Request). A per-host
// endpoint needs a host.
func (e Endpoint[Req, Resp]) Call(ctx context.Context, nc *nats.Conn, host string, req Req) (Resp, error) {
	if e.Scope.PerHost && host == "" {
		var zero Resp
		return zero, errdefs.Invalid("%s: no host given for a per-host endpoint", e.Subject("<host>"))
	}
	if e.Read {
		return RequestAgain[Resp](ctx, nc, e.Subject(host), req)
	}
	return Request[Resp](ctx, nc, e.Subject(host), req)
}

// CallJSON is Call for a caller that passes the reply on rather than reading it (prints it): the
// reply's data as the service encoded it (the JSON of a Resp), not decoded.
func (e Endpoint[Req, Resp]) CallJSON(ctx context.Context, nc *nats.Conn, host string, req Req) (json.RawMessage, error) {
	if e.Scope.PerHost && host == "" {
		return nil, errdefs.Invalid("%s: no host given for a per-host endpoint", e.Subject("<host>"))
	}
	if e.Read {
		return RequestAgain[json.RawMessage](ctx, nc, e.Subject(host), req)
	}
	return Request[json.RawMessage](ctx, nc, e.Subject(host), req)
}

// CallInto is Call decoding the reply into out, a pointer to a value of Resp's JSON shape that
// reads only what the caller needs (the ps table's columns of 10,000 sandboxes, not their
// whole records). A slice out is appended to from its start, in the room it already has.
func (e Endpoint[Req, Resp]) CallInto(ctx context.Context, nc *nats.Conn, host string, req Req, out any) error {
	if e.Scope.PerHost && host == "" {
		return errdefs.Invalid("%s: no host given for a per-host endpoint", e.Subject("<host>"))
	}
	return requestInto(ctx, nc, e.Subject(host), req, e.Read, out)
}
