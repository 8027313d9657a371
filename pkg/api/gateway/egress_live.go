package gateway

import (
	"context"
	"time"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/config"
)

// Live egress (issue 26): grants, revocations and denies on a sandbox that may be running.
// Every change is recorded in the sandbox (the registry), pushed to its running netstack and
// mitm, and audited on nexus.audit.gateway.<sandbox>.
var (
	EgressAllow  = bus.Endpoint[EgressChangeRequest, EgressChange]{Scope: bus.GatewayAPI, Verb: "egress.allow"}
	EgressRevoke = bus.Endpoint[EgressChangeRequest, EgressChange]{Scope: bus.GatewayAPI, Verb: "egress.revoke"}
	EgressDeny   = bus.Endpoint[EgressChangeRequest, EgressChange]{Scope: bus.GatewayAPI, Verb: "egress.deny"}
	EgressApply  = bus.Endpoint[EgressApplyRequest, EgressChange]{Scope: bus.GatewayAPI, Verb: "egress.apply"}
	// Ask mode: the pending requests of every sandbox, and a person's answer to one.
	EgressRequests = bus.Endpoint[Empty, []EgressRequest]{Scope: bus.GatewayAPI, Verb: "egress.requests"}
	EgressApprove  = bus.Endpoint[EgressAnswerRequest, EgressChange]{Scope: bus.GatewayAPI, Verb: "egress.approve"}
	EgressReject   = bus.Endpoint[EgressAnswerRequest, EgressChange]{Scope: bus.GatewayAPI, Verb: "egress.reject"}
)

// EgressRequest is a pending request of an ask-mode sandbox: a host its guest tried to reach.
type EgressRequest struct {
	ID      string    `json:"id"`
	Sandbox string    `json:"sandbox"`
	Host    string    `json:"host"`
	Port    int       `json:"port,omitempty"` // 0: a DNS query (any port)
	First   time.Time `json:"first"`
	Last    time.Time `json:"last"`
	Count   int       `json:"count"`
	// Reason is what the guest said it needs the host for (`nexus-why request`): reported by
	// the guest, bounded and stripped of control characters; the latest one given.
	Reason string `json:"reason,omitempty"`
	// Cmdline is the guest process that asked (pid and command line, from the guest agent):
	// reported by the guest, bounded and stripped of control characters.
	Cmdline string `json:"cmdline,omitempty"`
	// GuestReported labels Reason and Cmdline, when there are any, as GuestReportedNote.
	GuestReported string `json:"guest_reported,omitempty"`
}

// GuestReportedNote is what labels guest-supplied text wherever a request is shown.
const GuestReportedNote = "reason and cmdline are reported by the guest, not verified"

// Labelled returns r with GuestReported set when it carries guest-supplied text.
func (r EgressRequest) Labelled() EgressRequest {
	r.GuestReported = ""
	if r.Reason != "" || r.Cmdline != "" {
		r.GuestReported = GuestReportedNote
	}
	return r
}

// EgressAnswerRequest approves or rejects a pending request by ID.
type EgressAnswerRequest struct {
	ID string `json:"id"`
	// For and Ports shape the grant an approval makes (default: until revoked, 443 and 80).
	For   time.Duration `json:"for,omitempty"`
	Ports []int         `json:"ports,omitempty"`
	By    string        `json:"by,omitempty"`
	Via   string        `json:"via,omitempty"`
}

// Grant is one live change of a sandbox's egress: an allow rule (Egress.Grants) or a deny
// (Egress.Denies), with who made it, when, and until when.
type Grant struct {
	// Rule is host[:port,…] for a grant (the --allow-host form) and a host pattern for a deny.
	Rule string    `json:"rule"`
	By   string    `json:"by,omitempty"` // who asked, and through what ("alice via cli")
	At   time.Time `json:"at"`
	// Until ends the grant or deny on its own; zero lasts until it is revoked.
	Until time.Time `json:"until,omitzero"`
}

// Active reports whether the grant is in force at now.
func (g Grant) Active(now time.Time) bool { return g.Until.IsZero() || now.Before(g.Until) }

// EgressChangeRequest is the body of EgressAllow, EgressRevoke and EgressDeny.
type EgressChangeRequest struct {
	Name string `json:"name"`
	// Host is HOST[:PORT,…] for allow, HOST (a name, *.domain or an IPv4 address) otherwise.
	Host string `json:"host"`
	// For bounds the grant or deny (Go duration, nanoseconds on the wire); zero is until revoked.
	For time.Duration `json:"for,omitempty"`
	// By names who asks (the CLI sends the OS user); Via is the surface: cli or mcp.
	By  string `json:"by,omitempty"`
	Via string `json:"via,omitempty"`
}

// EgressApplyRequest is the body of EgressApply: the project's .nexus/config.yaml read again.
type EgressApplyRequest struct {
	Name   string         `json:"name"`
	Config *config.Config `json:"config"`
	By     string         `json:"by,omitempty"`
	Via    string         `json:"via,omitempty"`
	// DryRun prints the diff without applying it.
	DryRun bool `json:"dry_run,omitempty"`
}

// EgressChange is the reply to a live change: the effective allowlist and denies before and
// after it, and whether the running perimeter took it now (otherwise at the next start).
type EgressChange struct {
	Sandbox string   `json:"sandbox"`
	Before  []string `json:"before"`
	After   []string `json:"after"`
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	Live    bool     `json:"live"`
	Grant   *Grant   `json:"grant,omitempty"`
}

func (c *Client) EgressAllow(ctx context.Context, r EgressChangeRequest) (EgressChange, error) {
	return EgressAllow.Call(ctx, c.nc, "", r)
}
func (c *Client) EgressRevoke(ctx context.Context, r EgressChangeRequest) (EgressChange, error) {
	return EgressRevoke.Call(ctx, c.nc, "", r)
}
func (c *Client) EgressDeny(ctx context.Context, r EgressChangeRequest) (EgressChange, error) {
	return EgressDeny.Call(ctx, c.nc, "", r)
}
func (c *Client) EgressRequests(ctx context.Context) ([]EgressRequest, error) {
	return EgressRequests.Call(ctx, c.nc, "", Empty{})
}
func (c *Client) EgressApprove(ctx context.Context, r EgressAnswerRequest) (EgressChange, error) {
	return EgressApprove.Call(ctx, c.nc, "", r)
}
func (c *Client) EgressReject(ctx context.Context, r EgressAnswerRequest) (EgressChange, error) {
	return EgressReject.Call(ctx, c.nc, "", r)
}
func (c *Client) EgressApply(ctx context.Context, r EgressApplyRequest) (EgressChange, error) {
	return EgressApply.Call(ctx, c.nc, "", r)
}
