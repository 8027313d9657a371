package gateway

import (
	"github.com/IniZio/nexus/pkg/agentproto"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/bus"
)

// EgressWhy answers a guest's nexus-why (issue 26). Only the vmm calls it: the guest's agent
// forwards nexus-why over its channel, and the vmm names the sandbox of that channel, so the
// identity never comes from anything the guest says. The gateway reads the sandbox's recent
// refusals from the audit stream (every layer) and its netstack says what would allow each.
var EgressWhy = bus.Endpoint[EgressWhyRequest, netapi.WhyReply]{Scope: bus.GatewayAPI, Verb: "egress.why"}

// EgressWhyRequest is one nexus-why call of the sandbox SandboxID: a report, or a request for a
// host when Request is set.
type EgressWhyRequest struct {
	SandboxID string                 `json:"sandbox_id"`
	Request   *agentproto.WhyRequest `json:"request,omitempty"`
}
