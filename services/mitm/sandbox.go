package mitm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/netaddr"
)

// Sandboxes identifies the sandbox behind a CONNECT. Lookup returns errdefs.ErrNotFound for an
// unknown id; the proxy compares the presented token against Sandbox.TokenHash itself, in
// constant time.
type Sandboxes interface {
	Lookup(ctx context.Context, id string) (*Sandbox, error)
}

// Resolver returns the real credential a placeholder stands for, only when placeholder belongs to
// sandboxID and is bound to host (errdefs.ErrRefused otherwise). Implemented over the bus by
// credbroker's nexus.cred.resolve.
type Resolver interface {
	Resolve(ctx context.Context, sandboxID, host, placeholder string) (string, error)
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, sandboxID, host, placeholder string) (string, error)

func (f ResolverFunc) Resolve(ctx context.Context, sandboxID, host, placeholder string) (string, error) {
	return f(ctx, sandboxID, host, placeholder)
}

// HTTPPolicy judges one request to an allowed host after the host checks (request policies such
// as GitHub's). It may read and replace r.Body (bounded). A nil policy allows everything.
type HTTPPolicy interface {
	Decide(r *http.Request, host string) Verdict
}

// HTTPPolicyFunc adapts a function to HTTPPolicy.
type HTTPPolicyFunc func(r *http.Request, host string) Verdict

func (f HTTPPolicyFunc) Decide(r *http.Request, host string) Verdict { return f(r, host) }

// Verdict is an HTTPPolicy decision.
type Verdict struct {
	// Deny refuses the request with 403 and Reason (one line: what was refused and which flag or
	// config key would allow it).
	Deny   bool
	Rule   string
	Reason string
	// StripCredential forwards the request without its placeholder Authorization instead of
	// swapping it (GitHub archive downloads of foreign repositories).
	StripCredential bool
}

// Sandbox is what the proxy knows about one sandbox.
type Sandbox struct {
	ID        string
	Name      string // for people, in audit events
	TokenHash [32]byte
	Allowed   HostSet
	// Denied beats Allowed (`nexus egress deny`).
	Denied HostSet
	// creds maps a placeholder's SHA-256 to the hosts it is swapped on.
	creds map[[32]byte]HostSet
	// credHeader maps the placeholders bound to a header other than Authorization (x-api-key)
	// to that header; credHeaders lists those headers.
	credHeader  map[[32]byte]string
	credHeaders []string
	Policy      HTTPPolicy
	// guard is the destination address rule with the sandbox's --allow-private CIDRs.
	guard *netaddr.Guard

	// released caches credentials resolved for this sandbox, so a burst of requests costs one
	// resolve. It lives and dies with this registration.
	releasedMu sync.RWMutex
	released   map[releaseKey]releasedSecret
}

// releaseKey names a released credential: a placeholder on a host.
type releaseKey struct{ host, placeholder string }

// releasedSecret is a cached resolve.
type releasedSecret struct {
	value   string
	expires time.Time
}

// NewSandbox builds a Sandbox from its wire policy. policy may be nil.
func NewSandbox(p mitmapi.SandboxPolicy, policy HTTPPolicy) (*Sandbox, error) {
	if p.ID == "" {
		return nil, errdefs.Invalid("mitm: sandbox policy without an id")
	}
	tok, err := decodeHash(p.TokenHash)
	if err != nil {
		return nil, errdefs.Invalid("mitm: sandbox %s: token hash: %v", p.ID, err)
	}
	allowed, err := NewHostSet(p.AllowedHosts)
	if err != nil {
		return nil, errdefs.Invalid("mitm: sandbox %s: %v", p.ID, err)
	}
	denied, err := NewHostSet(p.DeniedHosts)
	if err != nil {
		return nil, errdefs.Invalid("mitm: sandbox %s: denied: %v", p.ID, err)
	}
	private, err := netaddr.ParseAllowPrivate(p.AllowPrivate)
	if err != nil {
		return nil, errdefs.Invalid("mitm: sandbox %s: %v", p.ID, err)
	}
	sb := &Sandbox{ID: p.ID, Name: p.Name, TokenHash: tok, Allowed: allowed, Denied: denied, creds: map[[32]byte]HostSet{}, Policy: policy, guard: netaddr.NewGuard(private, nil)}
	for _, c := range p.Credentials {
		h, err := decodeHash(c.PlaceholderHash)
		if err != nil {
			return nil, errdefs.Invalid("mitm: sandbox %s: placeholder hash: %v", p.ID, err)
		}
		hosts, err := NewHostSet(c.Hosts)
		if err != nil {
			return nil, errdefs.Invalid("mitm: sandbox %s: credential hosts: %v", p.ID, err)
		}
		sb.creds[h] = hosts
		if c.Header != "" {
			if sb.credHeader == nil {
				sb.credHeader = map[[32]byte]string{}
			}
			hdr := strings.ToLower(c.Header)
			sb.credHeader[h] = hdr
			if !slices.Contains(sb.credHeaders, hdr) {
				sb.credHeaders = append(sb.credHeaders, hdr)
			}
		}
	}
	return sb, nil
}

// AllowsHost reports whether the normalized host is allowed and not denied.
func (sb *Sandbox) AllowsHost(host string) bool {
	return sb.Allowed.Match(host) && !sb.Denied.Match(host)
}

func decodeHash(s string) ([32]byte, error) {
	var out [32]byte
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 32 {
		return out, fmt.Errorf("want 64 hex digits")
	}
	copy(out[:], b)
	return out, nil
}

// tokenOK compares a presented token with the sandbox's in constant time.
func (sb *Sandbox) tokenOK(token string) bool {
	h := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(h[:], sb.TokenHash[:]) == 1
}

// placeholder looks a candidate string up among this sandbox's placeholders.
func (sb *Sandbox) placeholder(tok string) (HostSet, bool) {
	if len(tok) != placeholderLen {
		return HostSet{}, false
	}
	return sb.placeholderBytes([]byte(tok))
}

// placeholderBytes is placeholder for a candidate in a byte slice, without allocating.
func (sb *Sandbox) placeholderBytes(tok []byte) (HostSet, bool) {
	if len(sb.creds) == 0 || len(tok) != placeholderLen {
		return HostSet{}, false
	}
	// Placeholders are minted in lower case; hex is case-insensitive, so an upper-cased copy is
	// recognised too.
	var lower [placeholderLen]byte
	for i, c := range tok {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	hosts, ok := sb.creds[sha256.Sum256(lower[:])]
	return hosts, ok
}

// credentialHeader is the header a placeholder of this sandbox is swapped in: "" for
// Authorization (the default), else the lower-case header its binding names.
func (sb *Sandbox) credentialHeader(tok []byte) string {
	if len(sb.credHeader) == 0 || len(tok) != placeholderLen {
		return ""
	}
	return sb.credHeader[sha256.Sum256(bytes.ToLower(tok))]
}

// Registry is an in-memory Sandboxes, fed by the mitm service's register/forget endpoints.
type Registry struct {
	mu sync.RWMutex
	m  map[string]*Sandbox
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{m: map[string]*Sandbox{}} }

// Put adds or replaces a sandbox; connections already open keep the policy they started with.
func (r *Registry) Put(sb *Sandbox) {
	r.mu.Lock()
	r.m[sb.ID] = sb
	r.mu.Unlock()
}

// Forget drops a sandbox.
func (r *Registry) Forget(id string) {
	r.mu.Lock()
	delete(r.m, id)
	r.mu.Unlock()
}

// Lookup implements Sandboxes.
func (r *Registry) Lookup(_ context.Context, id string) (*Sandbox, error) {
	r.mu.RLock()
	sb := r.m[id]
	r.mu.RUnlock()
	if sb == nil {
		return nil, errdefs.NotFound("mitm: no sandbox %q", id)
	}
	return sb, nil
}
