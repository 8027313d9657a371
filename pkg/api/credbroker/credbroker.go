// Package credbroker is the bus contract of the credential broker (DESIGN §5): subjects and the
// request and response bodies for the secret store (nexus secret set|ls|rm), placeholder minting
// at sandbox start, resolve (answered for the mitm only) and forget at removal.
//
// Secret values travel only in SecretSetRequest (CLI → broker) and ResolveResponse (broker →
// mitm); neither is ever logged.
package credbroker

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/bus"
)

// Endpoints, on nexus.cred.<verb>. Only the mitm may call Resolve (bus permissions).
var (
	Resolve      = bus.Endpoint[ResolveRequest, ResolveResponse]{Scope: bus.CredAPI, Verb: bus.CredResolveVerb}
	Mint         = bus.Endpoint[MintRequest, MintResponse]{Scope: bus.CredAPI, Verb: "mint"}
	Guard        = bus.Endpoint[GuardRequest, Empty]{Scope: bus.CredAPI, Verb: "guard"}
	Forget       = bus.Endpoint[ForgetRequest, Empty]{Scope: bus.CredAPI, Verb: "forget"}
	SecretSet    = bus.Endpoint[SecretSetRequest, Empty]{Scope: bus.CredAPI, Verb: "secret.set"}
	SecretList   = bus.Endpoint[Empty, SecretListResponse]{Scope: bus.CredAPI, Verb: "secret.list"}
	SecretRemove = bus.Endpoint[SecretRemoveRequest, Empty]{Scope: bus.CredAPI, Verb: "secret.remove"}
)

// Endpoints lists every endpoint of the contract (the bus tests check their permissions).
var Endpoints = []bus.Route{Resolve, Mint, Guard, Forget, SecretSet, SecretList, SecretRemove}

// Empty is the request or response of endpoints that carry nothing.
type Empty = struct{}

// Credential kinds; each seeds its own guest variable besides NEXUS_CRED_<HOST>_TOKEN.
const (
	KindGeneric   = ""
	KindAnthropic = "anthropic" // ANTHROPIC_AUTH_TOKEN (direct API)
	KindGitHub    = "github"    // GH_TOKEN
	KindOpenAI    = "openai"    // OPENAI_API_KEY
)

// KindEnv is the guest variable of each kind.
var KindEnv = map[string]string{
	KindAnthropic: "ANTHROPIC_AUTH_TOKEN",
	KindGitHub:    "GH_TOKEN",
	KindOpenAI:    "OPENAI_API_KEY",
}

// KindVar is the guest variable a binding of kind seeds when its credential goes in header:
// KindEnv's, except that an Anthropic key sent as x-api-key is ANTHROPIC_API_KEY (what clients
// send in that header; ANTHROPIC_AUTH_TOKEN is sent as a Bearer token).
func KindVar(kind, header string) string {
	if kind == KindAnthropic && header == "x-api-key" {
		return "ANTHROPIC_API_KEY"
	}
	return KindEnv[kind]
}

// ExpiresAt is the synthetic far-future expiry seeded beside every placeholder, so agents never
// try to refresh a brokered credential themselves.
const ExpiresAt = "2099-12-31T23:59:59Z"

// HostEnvPrefix names the per-host variables: NEXUS_CRED_<HOST>_TOKEN and _EXPIRES_AT.
func HostEnvPrefix(host string) string {
	var b strings.Builder
	b.WriteString("NEXUS_CRED_")
	for _, c := range strings.ToUpper(host) {
		if c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Binding asks for a secret to be brokered to a sandbox on some hosts.
type Binding struct {
	Secret string   `json:"secret"`
	Hosts  []string `json:"hosts"`
	Kind   string   `json:"kind,omitempty"`
	// Env optionally names one more guest variable carrying the binding's placeholder
	// (.nexus/config.yaml egress.secrets[].env).
	Env string `json:"env,omitempty"`
	// Header, when set, is the request header the binding's placeholders are swapped in
	// (x-api-key); by default the Authorization field (CredentialHeader).
	Header string `json:"header,omitempty"`
}

// MintRequest mints a sandbox's placeholders; it replaces any the sandbox had.
type MintRequest struct {
	SandboxID string    `json:"sandbox_id"`
	Bindings  []Binding `json:"bindings"`
}

// MintResponse is the guest environment to seed and, for the mitm, which placeholder (by hash)
// is bound to which hosts.
type MintResponse struct {
	Env         map[string]string           `json:"env"`
	Credentials []mitmapi.CredentialBinding `json:"credentials"`
}

// ResolveRequest asks for the real value behind a placeholder seen on a request to Host.
type ResolveRequest struct {
	SandboxID   string `json:"sandbox_id"`
	Host        string `json:"host"`
	Placeholder string `json:"placeholder"`
}

// ResolveResponse carries the real credential.
type ResolveResponse struct {
	Value string `json:"value"`
}

// ForgetRequest drops a removed sandbox's placeholders.
type ForgetRequest struct {
	SandboxID string `json:"sandbox_id"`
}

// SecretSetRequest stores a secret: exactly one of Value and Command (run on the host at resolve
// time, e.g. `gh auth token`). Hosts are the only hosts it may ever be sent to (WithinHosts).
type SecretSetRequest struct {
	Name    string   `json:"name"`
	Value   string   `json:"value,omitempty"`
	Command string   `json:"command,omitempty"`
	Hosts   []string `json:"hosts,omitempty"`
}

// SecretInfo describes a stored secret, never its value.
type SecretInfo struct {
	Name    string    `json:"name"`
	Hosts   []string  `json:"hosts,omitempty"`
	Source  string    `json:"source"` // "value" or "command"
	Updated time.Time `json:"updated"`
}

// SecretListResponse lists the store.
type SecretListResponse struct {
	Secrets []SecretInfo `json:"secrets"`
}

// SecretRemoveRequest removes a secret.
type SecretRemoveRequest struct {
	Name string `json:"name"`
}

// GuardRequest arms the Claude credential guardian for a sandbox that live-mounts the host's
// credentials; Forget disarms it.
type GuardRequest struct {
	SandboxID string `json:"sandbox_id"`
}

// Client calls the credential broker.
type Client struct{ nc *nats.Conn }

// NewClient returns a credbroker client over nc.
func NewClient(nc *nats.Conn) *Client { return &Client{nc: nc} }

func (c *Client) Resolve(ctx context.Context, r ResolveRequest) (ResolveResponse, error) {
	return Resolve.Call(ctx, c.nc, "", r)
}
func (c *Client) Mint(ctx context.Context, r MintRequest) (MintResponse, error) {
	return Mint.Call(ctx, c.nc, "", r)
}
func (c *Client) Guard(ctx context.Context, id string) error {
	_, err := Guard.Call(ctx, c.nc, "", GuardRequest{SandboxID: id})
	return err
}
func (c *Client) Forget(ctx context.Context, id string) error {
	_, err := Forget.Call(ctx, c.nc, "", ForgetRequest{SandboxID: id})
	return err
}
func (c *Client) SecretSet(ctx context.Context, r SecretSetRequest) error {
	_, err := SecretSet.Call(ctx, c.nc, "", r)
	return err
}
func (c *Client) SecretList(ctx context.Context) (SecretListResponse, error) {
	return SecretList.Call(ctx, c.nc, "", Empty{})
}
func (c *Client) SecretRemove(ctx context.Context, name string) error {
	_, err := SecretRemove.Call(ctx, c.nc, "", SecretRemoveRequest{Name: name})
	return err
}
