// Package mitm is the bus contract of the mitm service (DESIGN §5): its endpoints, the request
// and response bodies and a typed client the gateway and the netstack use to register sandboxes with the MITM and fetch
// its CA certificate.
//
// Secrets never travel here: a sandbox's proxy token and its credential placeholders are sent as
// SHA-256 hashes (HashHex), which is all the MITM needs to recognise them.
package mitm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/httppolicy"
)

// Endpoints, on nexus.mitm.<host>.<verb>.
var (
	Register = bus.Endpoint[RegisterRequest, RegisterResponse]{Scope: bus.MITMAPI, Verb: "register"}
	Forget   = bus.Endpoint[ForgetRequest, Empty]{Scope: bus.MITMAPI, Verb: "forget"}
	CACert   = bus.Endpoint[Empty, CACertResponse]{Scope: bus.MITMAPI, Verb: "cacert"}
	// SetHosts replaces what a live change of a registered sandbox's egress can change (hosts,
	// denials, request policy, private CIDRs), keeping its token and credentials: live grants,
	// revocations and `nexus egress apply`.
	SetHosts = bus.Endpoint[SetHostsRequest, Empty]{Scope: bus.MITMAPI, Verb: "hosts"}
)

// Endpoints lists every endpoint of the contract (the bus tests check their permissions).
var Endpoints = []bus.Route{Register, Forget, CACert, SetHosts}

// Empty is the request or response of endpoints that carry nothing.
type Empty = struct{}

// SandboxPolicy is everything the MITM knows about one sandbox.
type SandboxPolicy struct {
	ID string `json:"id"`
	// Name is the sandbox's name, which audit events carry for people (the id is the key).
	Name string `json:"name,omitempty"`
	// TokenHash is HashHex of the token the netstack shim presents in Proxy-Authorization.
	TokenHash string `json:"token_hash"`
	// AllowedHosts is the hostname allowlist ("api.github.com", "*.example.com").
	AllowedHosts []string `json:"allowed_hosts"`
	// Credentials binds placeholders (by hash) to the only hosts they are swapped on.
	Credentials []CredentialBinding `json:"credentials,omitempty"`
	// Requests is the request policy (bound repos, .nexus/config.yaml egress.policy, allowed
	// branches) the mitm applies to every request on top of the host allowlist; nil gates nothing.
	Requests *httppolicy.Policy `json:"requests,omitempty"`
	// AllowPrivate are the non-public CIDRs the sandbox may reach (--allow-private): the mitm's
	// dialer refuses every other such address (pkg/netaddr), a second line behind the netstack.
	AllowPrivate []string `json:"allow_private,omitempty"`
	// DeniedHosts are refused even where AllowedHosts covers them (`nexus egress deny`).
	DeniedHosts []string `json:"denied_hosts,omitempty"`
}

// SetHostsRequest is the body of SetHosts.
type SetHostsRequest struct {
	ID           string             `json:"id"`
	AllowedHosts []string           `json:"allowed_hosts"`
	DeniedHosts  []string           `json:"denied_hosts,omitempty"`
	Requests     *httppolicy.Policy `json:"requests,omitempty"`
	AllowPrivate []string           `json:"allow_private,omitempty"`
}

// DialAddrHeader, on the netstack's CONNECT (whose Proxy-Authorization binds it to the
// sandbox), carries the ip:port the netstack judged for the connection. The mitm dials exactly
// that address and never resolves the CONNECT host again.
const DialAddrHeader = "Nexus-Dial-Addr"

// CredentialBinding says that the placeholder whose hash is PlaceholderHash is swapped for a real
// credential on Hosts and nowhere else.
type CredentialBinding struct {
	PlaceholderHash string   `json:"placeholder_hash"`
	Hosts           []string `json:"hosts"`
	// Header, when set, is the lower-case request header whose whole value the placeholder is
	// swapped in (x-api-key); by default it is swapped in Authorization (Bearer, token, Basic).
	Header string `json:"header,omitempty"`
}

// RegisterRequest adds or replaces a sandbox's policy.
type RegisterRequest struct {
	Policy SandboxPolicy `json:"policy"`
}

// ForgetRequest drops a sandbox.
type ForgetRequest struct {
	ID string `json:"id"`
}

// CACertResponse carries the installation's MITM CA certificate for guests to trust.
type CACertResponse struct {
	PEM string `json:"pem"`
}

// HashHex is the lowercase hex SHA-256 of s: the form in which tokens and placeholders are shared.
func HashHex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// RegisterResponse says where the MITM accepts the netstack shim's CONNECTs.
type RegisterResponse struct {
	Addr string `json:"addr"`
}

// AddrFile is where, under $NEXUS_HOME/run, the mitm writes its listen address for the netstack
// of the same host.
const AddrFile = "mitm.addr"

// Client calls the mitm of one host.
type Client struct {
	nc   *nats.Conn
	host string
}

// NewClient returns a client for the mitm on host.
func NewClient(nc *nats.Conn, host string) *Client { return &Client{nc: nc, host: host} }

func (c *Client) Register(ctx context.Context, p SandboxPolicy) (RegisterResponse, error) {
	return Register.Call(ctx, c.nc, c.host, RegisterRequest{Policy: p})
}
func (c *Client) Forget(ctx context.Context, id string) error {
	_, err := Forget.Call(ctx, c.nc, c.host, ForgetRequest{ID: id})
	return err
}
func (c *Client) SetHosts(ctx context.Context, r SetHostsRequest) error {
	_, err := SetHosts.Call(ctx, c.nc, c.host, r)
	return err
}
func (c *Client) CACert(ctx context.Context) (CACertResponse, error) {
	return CACert.Call(ctx, c.nc, c.host, Empty{})
}
