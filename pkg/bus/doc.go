// Package bus is how nexus processes talk: an embedded NATS server with JetStream, the
// connection every service and client opens to it, and request/reply endpoints with one
// envelope (DESIGN §2).
//
// # Server and users
//
// StartServer runs nats-server in process, listening on 127.0.0.1 (DefaultPort), with its
// JetStream store under $NEXUS_HOME/bus; a lock file keeps a second bus off the same home.
// Every process connects (Connect) as its own user whose password is generated at the first
// start into $NEXUS_HOME/bus/creds/<user>.json (0600). The permission table in users.go is
// least privilege: each user publishes only to the scopes it calls and subscribes only to its
// own scope, replies travel on the user's private inbox prefix, and one verb is singled out
// (only the mitm may request nexus.cred.resolve). A client without a running bus gets one
// sentence naming the bus URL.
//
// # Subjects
//
// Requests go to nexus.<service>.<verb>, or nexus.<service>.<host>.<verb> for services that run
// once per host (vmm, netstack, mitm, gitrelay, portfwd); a single machine is host "local"
// (LocalHost). A Scope names one such subject space. Besides requests:
// nexus.events.> carries lifecycle, listener and port events, nexus.audit.egress.<sandbox>
// the audit events, and nexus.stream.<host>.<sid>.in|out the streamed sessions of pkg/stream.
//
// # Endpoints
//
// Each service's contract package, pkg/api/<service>, declares its endpoints once, as values:
//
//	var Mint = bus.Endpoint[MintRequest, MintResponse]{Scope: bus.CredAPI, Verb: "mint"}
//
// The service serves the value, on its own host, inside Serve's register callback:
//
//	credapi.Mint.Serve(svc, func(ctx context.Context, r credapi.MintRequest) (credapi.MintResponse, error) { … })
//
// and the contract's typed client calls it:
//
//	func (c *Client) Mint(ctx context.Context, r MintRequest) (MintResponse, error) {
//		return Mint.Call(ctx, c.nc, "", r) // the host is "" for a scope that is not per host
//	}
//
// so the subject and the request and response types cannot differ between the two sides.
// Verbs are dotted lower-case words ("sandbox.create", "snapshot.remove"; removal is always
// "remove"); the micro endpoint name is the verb with dashes. Each contract lists its
// endpoints in Endpoints, and this package's tests check that each is served by its service's
// user and requestable by its intended callers only.
//
// # Envelope, deadlines and errors
//
// Bodies are JSON. Every reply is {"ok":true,"data":…} or
// {"ok":false,"error":{"code":"not_found","message":"…"}}, the code one of pkg/errdefs' small
// set, translated once at the edge (EncodeError on the way out, Decode back into the same
// errdefs class on the way in); the message is the sentence a user reads. Every request has a
// deadline, the context's or DefaultTimeout, sent in the Nexus-Deadline header so the handler's
// context ends when the caller stops waiting (and never later than MaxHandlerTime). Handlers
// run concurrently, a panic becomes an internal error, and no responder, a timeout and a
// permission refusal each become one classified sentence naming the service.
//
// # Streams and buckets
//
// EnsureJetStream (run by the bus user only) creates the streams NEXUS_AUDIT (nexus.audit.>,
// file storage, limited by age and bytes) and NEXUS_EVENTS (nexus.events.>) and the KV buckets
// nexus_sandboxes, nexus_ports, nexus_snapshots and nexus_leases (with a TTL); services bind
// to them with KV and may not delete them. These names, unlike request subjects, persist
// across builds.
package bus
