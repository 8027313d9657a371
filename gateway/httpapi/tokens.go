package httpapi

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/pkg/records"
)

// Scope is what a token may do. Each scope includes the ones before it.
type Scope string

const (
	// ScopeRead reads: list, get, logs, ports, egress show/explain, audit, files out of a guest.
	ScopeRead Scope = "read"
	// ScopeWrite also changes sandboxes: create, lifecycle, exec, files into a guest, snapshots.
	ScopeWrite Scope = "write"
	// ScopeAdmin also reaches the host's own files and secrets: host mounts, a project config
	// read from the host, secret bindings and the secret store, worktree delegation, and the
	// agent profiles that live-mount a host credential directory (claude-code's ~/.claude).
	ScopeAdmin Scope = "admin"
)

// Scopes lists the scopes, weakest first.
var Scopes = []Scope{ScopeRead, ScopeWrite, ScopeAdmin}

func (s Scope) rank() int {
	for i, o := range Scopes {
		if o == s {
			return i
		}
	}
	return -1
}

// Allows says whether a token of scope s may do what needs scope need.
func (s Scope) Allows(need Scope) bool { return s.rank() >= 0 && s.rank() >= need.rank() }

// ParseScope reads a --scope value.
func ParseScope(s string) (Scope, error) {
	if Scope(s).rank() < 0 {
		return "", errdefs.Invalid("invalid scope %q: use read, write or admin", s)
	}
	return Scope(s), nil
}

// Token is one API token as stored: its secret only as a SHA-256 hash.
type Token struct {
	Name      string    `json:"name"`
	Scope     Scope     `json:"scope"`
	Hash      string    `json:"hash"`
	CreatedAt time.Time `json:"created_at"`
}

// TokenPrefix starts every token secret, so that a leaked one is recognisable (secret scanners).
const TokenPrefix = "nexus_"

var tokenNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// TokenDir is where the tokens of home are kept: one record per token, mode 0600.
func TokenDir(h home.Dir) string { return filepath.Join(string(h), "api", "tokens") }

// Tokens is the token store: written by `nexus token`, read by the API server, which notices
// a create or revoke at the next request (the directory's modification time changes).
type Tokens struct {
	store *records.Store[Token]

	mu     sync.Mutex
	stamp  time.Time // the directory's modification time at the last load
	loaded time.Time // when it was loaded: a coarse clock may hide a change, so at most reloadEvery old
	byHash map[string]Token
}

// reloadEvery bounds how long a loaded token list is trusted without reading it again.
const reloadEvery = 2 * time.Second

// OpenTokens opens the token store of h.
func OpenTokens(h home.Dir, log zerolog.Logger) (*Tokens, error) {
	st, err := records.Open[Token](TokenDir(h), log)
	if err != nil {
		return nil, err
	}
	return &Tokens{store: st}, nil
}

func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Create makes a token and returns its secret, which is not kept: it is shown once.
func (t *Tokens) Create(name string, scope Scope) (string, Token, error) {
	if !tokenNameRE.MatchString(name) {
		return "", Token{}, errdefs.Invalid("invalid token name %q: use 1-63 of a-z 0-9 . _ - starting with a letter or digit", name)
	}
	if scope.rank() < 0 {
		return "", Token{}, errdefs.Invalid("invalid scope %q: use read, write or admin", scope)
	}
	if _, err := t.store.Get(name); err == nil {
		return "", Token{}, errdefs.Conflict("token %s exists: revoke it first (nexus token revoke %s)", name, name)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return "", Token{}, err
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", Token{}, err
	}
	secret := TokenPrefix + hex.EncodeToString(b)
	tok := Token{Name: name, Scope: scope, Hash: hashSecret(secret), CreatedAt: time.Now().UTC()}
	if err := t.store.Put(name, tok); err != nil {
		return "", Token{}, err
	}
	return secret, tok, nil
}

// List returns every token, by name; damaged records are left out.
func (t *Tokens) List() ([]Token, error) {
	ents, err := os.ReadDir(t.store.Dir())
	if err != nil {
		return nil, err
	}
	var out []Token
	for _, e := range ents {
		key, ok := strings.CutSuffix(e.Name(), records.Ext)
		if !ok || e.IsDir() || records.CheckKey(key) != nil {
			continue
		}
		if tok, err := t.store.Get(key); err == nil && tok.Name == key && tok.Hash != "" {
			out = append(out, tok)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Revoke removes a token; requests with it are refused from then on.
func (t *Tokens) Revoke(name string) error {
	if _, err := t.store.Get(name); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.NotFound("no token %q (nexus token ls lists them)", name)
		}
		return err
	}
	return t.store.Delete(name)
}

// Lookup finds the token whose secret is given.
func (t *Tokens) Lookup(secret string) (Token, bool) {
	if !strings.HasPrefix(secret, TokenPrefix) || len(secret) > 128 {
		return Token{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	fi, err := os.Stat(t.store.Dir())
	if err != nil {
		return Token{}, false
	}
	if t.byHash == nil || !fi.ModTime().Equal(t.stamp) || time.Since(t.loaded) > reloadEvery {
		toks, err := t.List()
		if err != nil {
			return Token{}, false
		}
		t.byHash = make(map[string]Token, len(toks))
		for _, tok := range toks {
			t.byHash[tok.Hash] = tok
		}
		t.stamp, t.loaded = fi.ModTime(), time.Now()
	}
	tok, ok := t.byHash[hashSecret(secret)]
	return tok, ok
}
