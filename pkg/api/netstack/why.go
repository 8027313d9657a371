package netstack

import (
	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// Why answers a guest's nexus-why (issue 26) for one sandbox: the gateway reads the sandbox's
// recent refusals from the audit stream (every layer) and the netstack, which holds the live
// policy, says what would allow each; or it judges and files a request (ask mode).
var Why = bus.Endpoint[WhyRequest, WhyReply]{Scope: bus.NetstackAPI, Verb: "why"}

// MaxWhyDenials bounds the refusals a nexus-why report lists (the most recent ones).
const MaxWhyDenials = 32

// WhyRequest is one nexus-why call for SandboxID: the report of Denials (at most
// MaxWhyDenials, oldest first) or, when Request is set, a request for a host.
type WhyRequest struct {
	SandboxID string                 `json:"sandbox_id"`
	Denials   []audit.Event          `json:"denials,omitempty"`
	Request   *agentproto.WhyRequest `json:"request,omitempty"`
}

// WhyReply is the answer the guest sees: an HTTP-like Status with the Report, or a one-line
// Message (the outcome of a request, or why the call failed).
type WhyReply struct {
	Status  int                   `json:"status"`
	Report  *agentproto.WhyReport `json:"report,omitempty"`
	Message string                `json:"message,omitempty"`
}
