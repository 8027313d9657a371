// Package netstack is the contract of the netstack service: its endpoints on
// `nexus.netstack.<host>.<verb>`, their request and response bodies and a typed client.
package netstack

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/policy"
)

// Endpoints, on nexus.netstack.<host>.<verb>.
var (
	Create = bus.Endpoint[CreateRequest, Info]{Scope: bus.NetstackAPI, Verb: "create"}
	Update = bus.Endpoint[UpdateRequest, Info]{Scope: bus.NetstackAPI, Verb: "update"}
	Remove = bus.Endpoint[RemoveRequest, Empty]{Scope: bus.NetstackAPI, Verb: "remove"}
	Show   = bus.Endpoint[ShowRequest, Info]{Scope: bus.NetstackAPI, Verb: "show"}
)

// Endpoints lists every endpoint of the contract (the bus tests check their permissions).
var Endpoints = []bus.Route{Create, Update, Remove, Show, Why}

// Empty is the response of endpoints that return nothing.
type Empty = struct{}

// Client calls the netstack of one host.
type Client struct {
	nc   *nats.Conn
	host string
}

// NewClient returns a client for the netstack on host.
func NewClient(nc *nats.Conn, host string) *Client { return &Client{nc: nc, host: host} }

func (c *Client) Create(ctx context.Context, r CreateRequest) (Info, error) {
	return Create.Call(ctx, c.nc, c.host, r)
}
func (c *Client) Remove(ctx context.Context, id string) error {
	_, err := Remove.Call(ctx, c.nc, c.host, RemoveRequest{SandboxID: id})
	return err
}
func (c *Client) Update(ctx context.Context, r UpdateRequest) (Info, error) {
	return Update.Call(ctx, c.nc, c.host, r)
}
func (c *Client) Show(ctx context.Context, id string) (Info, error) {
	return Show.Call(ctx, c.nc, c.host, ShowRequest{SandboxID: id})
}

// Egress modes.
const (
	ModeCurated  = "curated"   // allowlist enforced, 443/80 through the SNI→CONNECT shim into mitm
	ModeAllowAll = "allow-all" // everything allowed (audited) until AllowAllUntil, then default-deny
	ModeNone     = "none"      // nothing leaves the sandbox
)

// DefaultAllowAllFor is the allow-all window when a request does not give one.
const DefaultAllowAllFor = 24 * time.Hour

// Policy is the part of a network that can change while it runs.
type Policy struct {
	Mode string `json:"mode"`
	// AllowAllUntil ends allow-all; after it the network is default-deny (only Allow applies).
	// Zero in allow-all mode means now + DefaultAllowAllFor.
	AllowAllUntil time.Time     `json:"allow_all_until,omitzero"`
	Allow         []policy.Rule `json:"allow,omitempty"`
	// Repos is opaque to netstack (owner/repo bindings for gitrelay and mitm); kept and shown.
	Repos []string `json:"repos,omitempty"`
	// AllowPrivate are the CIDRs of non-public addresses (RFC 1918, CGNAT, link-local, ...) the
	// sandbox may reach (--allow-private); every other such address is refused in every mode,
	// as a DNS answer and as a destination (pkg/netaddr).
	AllowPrivate []string `json:"allow_private,omitempty"`
	// Deny are host patterns (`nexus egress deny`) refused whatever rule of Allow covers them
	// (audited with rule egress_deny).
	Deny []string `json:"deny,omitempty"`
	// Ask holds a DNS query for a name not allowed (at most AskHold, then SERVFAIL), and a TCP
	// connection to a destination not allowed (its handshake unanswered, at most AskHoldTCP),
	// and reports each as an EgressRequest, so that a person may approve it meanwhile.
	Ask bool `json:"ask,omitempty"`
	// Pending are the PendingKey of the sandbox's recorded requests: a held query or connection
	// whose request was pending and no longer is, and is still not allowed, was rejected and is
	// refused at once.
	Pending []string `json:"pending,omitempty"`
}

// PendingKey names a request in Policy.Pending: host, or host:port (port 0 is a DNS query).
func PendingKey(host string, port int) string {
	if port == 0 {
		return host
	}
	return host + ":" + strconv.Itoa(port)
}

// RequestSubjectPrefix is where a netstack publishes the queries it holds for approval:
// nexus.events.egress.request.<sandbox id>.
const RequestSubjectPrefix = "nexus.events.egress.request"

// GuestReportedNote labels the guest-supplied text of an EgressRequest.
const GuestReportedNote = "reason reported by the guest, not verified"

// EgressRequest is one held query (or connection) of an ask-mode sandbox.
type EgressRequest struct {
	SandboxID   string `json:"sandbox_id"`
	SandboxName string `json:"sandbox_name,omitempty"`
	Host        string `json:"host"`
	Port        int    `json:"port,omitempty"` // 0: a DNS query (any port)
	// Reason is what the guest said it needs the host for (nexus-why request), reported by the
	// guest: bounded and stripped of control characters.
	Reason string `json:"reason,omitempty"`
	// GuestReported labels Reason, when there is one, as GuestReportedNote.
	GuestReported string `json:"guest_reported,omitempty"`
	// Proto and SrcPort are the guest socket that asked (tcp or udp, its local port), for the
	// gateway to ask the guest agent which process holds it; zero when filed by nexus-why.
	Proto   string    `json:"proto,omitempty"`
	SrcPort int       `json:"src_port,omitempty"`
	Time    time.Time `json:"time"`
}

// Spec creates one sandbox network (CreateRequest on the bus).
type Spec struct {
	SandboxID   string `json:"sandbox_id"`
	SandboxName string `json:"sandbox_name,omitempty"`
	Policy
	// SocketPath is the unix socket netstack listens on; QEMU connects to it with
	// -netdev stream,server=off,addr.type=unix,addr.path=<SocketPath>. Empty in a create over
	// the bus: the sandbox's directory of the netstack's own home (Info.SocketPath says it),
	// which is what a gateway on another host of a cluster asks for.
	SocketPath string `json:"socket_path"`
	// GuestMAC, when set, pins the DHCP lease of GuestIP to this MAC.
	GuestMAC string `json:"guest_mac,omitempty"`
	// ProxyToken identifies the sandbox to mitm (Proxy-Authorization: Basic sandboxID:token).
	// It is a secret: never logged, never in Info or audit events.
	ProxyToken string `json:"proxy_token,omitempty"`
	// Dial makes the netstack connect to SocketPath, where QEMU listens
	// (-netdev stream,server=on), reconnecting whenever the connection ends; without it the
	// netstack listens and QEMU connects.
	Dial bool `json:"dial,omitempty"`
	// Limits are the network's egress budgets; zero fields take DefaultLimits.
	Limits Limits `json:"limits,omitzero"`
}

// Limits are a sandbox's egress budgets, enforced by its netstack. Zero fields take the
// defaults of DefaultLimits. Hitting one is audited once per second with a count, under the
// rule named in each field's comment.
type Limits struct {
	// MaxConns bounds open TCP connections and UDP flows at once (rule max_conns: the SYN is
	// reset, the datagram dropped).
	MaxConns int `json:"max_conns,omitempty"`
	// ConnRate bounds new TCP connections and UDP flows per second, with a burst of as many
	// (rule conn_rate).
	ConnRate int `json:"conn_rate,omitempty"`
	// DNSRate bounds DNS queries per second, with a burst of as many (rule dns_rate: REFUSED).
	DNSRate int `json:"dns_rate,omitempty"`
	// EgressBandwidth bounds the bytes per second the guest sends out, over all its connections
	// (rule egress_bandwidth: writes wait; nothing is dropped).
	EgressBandwidth int64 `json:"egress_bandwidth,omitempty"`
	// IngressBandwidth bounds the bytes per second the guest receives from outside, over all
	// its connections (rule ingress_bandwidth: writes to the guest wait; nothing is dropped).
	// Zero in a record from before it: the default.
	IngressBandwidth int64 `json:"ingress_bandwidth,omitempty"`
}

// DefaultLimits are the budgets of a sandbox that sets none: far above what builds, package
// installs and agents use, low enough that one sandbox cannot exhaust the host's sockets.
var DefaultLimits = Limits{MaxConns: 1024, ConnRate: 500, DNSRate: 200, EgressBandwidth: 100 << 20, IngressBandwidth: 100 << 20}

// WithDefaults returns l with zero fields set from DefaultLimits.
func (l Limits) WithDefaults() Limits { return DefaultLimits.Merge(l) }

// Validate refuses negative budgets and a connection cap past what a host can hold.
func (l Limits) Validate() error {
	switch {
	case l.MaxConns < 0 || l.MaxConns > MaxMaxConns:
		return errdefs.Invalid("--max-conns %d is out of range: use 1 to %d", l.MaxConns, MaxMaxConns)
	case l.ConnRate < 0:
		return errdefs.Invalid("--conn-rate %d is negative: give new connections per second", l.ConnRate)
	case l.DNSRate < 0:
		return errdefs.Invalid("--dns-rate %d is negative: give queries per second", l.DNSRate)
	case l.EgressBandwidth < 0:
		return errdefs.Invalid("--egress-bandwidth %d is negative: give a size per second, as in 10m", l.EgressBandwidth)
	case l.IngressBandwidth < 0:
		return errdefs.Invalid("--ingress-bandwidth %d is negative: give a size per second, as in 10m", l.IngressBandwidth)
	}
	return nil
}

// MaxMaxConns is the highest connection cap a sandbox may ask for.
const MaxMaxConns = 65536

// Merge returns l with the non-zero fields of over replacing its own.
func (l Limits) Merge(over Limits) Limits {
	if over.MaxConns != 0 {
		l.MaxConns = over.MaxConns
	}
	if over.ConnRate != 0 {
		l.ConnRate = over.ConnRate
	}
	if over.DNSRate != 0 {
		l.DNSRate = over.DNSRate
	}
	if over.EgressBandwidth != 0 {
		l.EgressBandwidth = over.EgressBandwidth
	}
	if over.IngressBandwidth != 0 {
		l.IngressBandwidth = over.IngressBandwidth
	}
	return l
}

// CreateRequest is the body of Create.
type CreateRequest = Spec

// UpdateRequest replaces the policy of a running network (Update). Every new decision uses the
// new policy, and open connections it refuses are closed (audited with rule policy_revoked).
type UpdateRequest struct {
	SandboxID string `json:"sandbox_id"`
	Policy
	// Limits, when set, replace the network's egress budgets (`nexus egress apply` of a changed
	// egress.limits); nil keeps them.
	Limits *Limits `json:"limits,omitempty"`
}

// RemoveRequest is the body of Remove.
type RemoveRequest struct {
	SandboxID string `json:"sandbox_id"`
}

// ShowRequest is the body of Show.
type ShowRequest struct {
	SandboxID string `json:"sandbox_id"`
}

// Info describes one network; it is the reply to create, update and show.
type Info struct {
	SandboxID   string `json:"sandbox_id"`
	SandboxName string `json:"sandbox_name,omitempty"`
	// Mode is the configured mode; EffectiveMode is what decisions use now (an expired allow-all
	// is "curated": default-deny plus Rules).
	Mode          string        `json:"mode"`
	EffectiveMode string        `json:"effective_mode"`
	Expiry        time.Time     `json:"expiry,omitzero"`
	Rules         []policy.Rule `json:"rules,omitempty"`
	Repos         []string      `json:"repos,omitempty"`
	SocketPath    string        `json:"socket_path"`
	GatewayIP     string        `json:"gateway_ip"`
	GuestIP       string        `json:"guest_ip"`
	GuestAttached bool          `json:"guest_attached"`
	DNS           []DNSEntry    `json:"dns,omitempty"`
	Counters      Counters      `json:"counters"`
	Limits        Limits        `json:"limits"` // in force, defaults filled in
}

// DNSEntry is one name the guest resolved and the IPv4 addresses it was answered.
type DNSEntry struct {
	Name    string    `json:"name"`
	IPs     []string  `json:"ips"`
	TTL     int       `json:"ttl"`     // seconds, as answered
	Expires time.Time `json:"expires"` // when the answer's TTL runs out (connections keep a grace)
}

// Counters are per-sandbox decision counts since the network was created.
type Counters struct {
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
	// BytesOut and BytesIn are what the guest's NIC sent and received (every frame, on the
	// perimeter's side of it); Flows is the number of forwarded connections open now.
	BytesOut uint64 `json:"bytes_out"`
	BytesIn  uint64 `json:"bytes_in"`
	Flows    int    `json:"flows"`
	// Limited counts what a budget refused or held back (connections, queries, delayed writes).
	Limited uint64 `json:"limited"`
}
