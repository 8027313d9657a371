// Package mitm is the bus contract of the mitm service (DESIGN §5): subjects and the request and
// response bodies the gateway and the netstack use to register sandboxes with the MITM and fetch
// its CA certificate.
//
// Secrets never travel here: a sandbox's proxy token and its credential placeholders are sent as
// SHA-256 hashes (HashHex), which is all the MITM needs to recognise them.
package mitm

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/IniZio/nexus/pkg/httppolicy"
)

// Subject verbs; the full subject is nexus.mitm.<host>.<verb>.
const (
	Prefix       = "nexus.mitm"
	VerbRegister = "register"
	VerbForget   = "forget"
	VerbCACert   = "cacert"
)

// Subject builds nexus.mitm.<host>.<verb>.
func Subject(host, verb string) string { return Prefix + "." + host + "." + verb }

// SandboxPolicy is everything the MITM knows about one sandbox.
type SandboxPolicy struct {
	ID string `json:"id"`
	// TokenHash is HashHex of the token the netstack shim presents in Proxy-Authorization.
	TokenHash string `json:"token_hash"`
	// AllowedHosts is the hostname allowlist ("api.github.com", "*.example.com").
	AllowedHosts []string `json:"allowed_hosts"`
	// Credentials binds placeholders (by hash) to the only hosts they are swapped on.
	Credentials []CredentialBinding `json:"credentials,omitempty"`
	// Requests is the request policy (bound repos, .nexus/config.yaml egress.policy, allowed
	// branches) the mitm applies to every request on top of the host allowlist; nil gates nothing.
	Requests *httppolicy.Policy `json:"requests,omitempty"`
}

// CredentialBinding says that the placeholder whose hash is PlaceholderHash is swapped for a real
// credential on Hosts and nowhere else.
type CredentialBinding struct {
	PlaceholderHash string   `json:"placeholder_hash"`
	Hosts           []string `json:"hosts"`
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
