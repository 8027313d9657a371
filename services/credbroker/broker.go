package credbroker

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Limits on what a user can store.
const (
	maxValueBytes   = 64 << 10
	maxCommandBytes = 4 << 10
	maxOutputBytes  = 64 << 10
)

// Log field keys.
const (
	logKeySecret  = "secret"
	logKeySandbox = "sandbox"
)

// brokerConfig configures a Broker.
type brokerConfig struct {
	// Dir holds the key and the encrypted store ($NEXUS_HOME/secrets).
	Dir    string
	Logger zerolog.Logger
	// CommandTimeout bounds one run of a command secret (default 10 s).
	CommandTimeout time.Duration
	// CommandCacheTTL reuses a command secret's output for this long, so a burst of requests runs
	// `gh auth token` once (default 60 s; negative disables).
	CommandCacheTTL time.Duration
	// Now is the clock (tests).
	Now func() time.Time
}

// Broker is the credential broker.
type Broker struct {
	cfg  brokerConfig
	log  zerolog.Logger
	disk *diskStore

	mu     sync.Mutex
	st     *state
	loaded fileID

	cmdMu    sync.Mutex
	cmdCache map[string]cmdResult
}

type cmdResult struct {
	out     string
	expires time.Time
}

// newBroker opens (creating on first use) the store in cfg.Dir.
func newBroker(cfg brokerConfig) (*Broker, error) {
	if cfg.Dir == "" {
		return nil, errors.New("credbroker: no secret store directory configured")
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = 10 * time.Second
	}
	if cfg.CommandCacheTTL == 0 {
		cfg.CommandCacheTTL = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	disk, err := openDiskStore(cfg.Dir)
	if err != nil {
		return nil, err
	}
	st, id, err := disk.load()
	if err != nil {
		return nil, err
	}
	return &Broker{cfg: cfg, log: cfg.Logger, disk: disk, st: st, loaded: id, cmdCache: map[string]cmdResult{}}, nil
}

// update runs fn on the freshest state under the store lock and saves the result: another
// process (a CLI or a second broker) may have written since we loaded.
func (b *Broker) update(fn func(st *state) error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	unlock, err := lockDir(b.cfg.Dir)
	if err != nil {
		return err
	}
	defer unlock()
	st, _, err := b.disk.load()
	if err != nil {
		return err
	}
	if err := fn(st); err != nil {
		return err
	}
	id, err := b.disk.save(st)
	if err != nil {
		return err
	}
	b.st, b.loaded = st, id
	return nil
}

// current returns the in-memory state, reloading it when the file changed underneath.
func (b *Broker) current() (*state, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if id := b.disk.stat(); id != b.loaded {
		st, id, err := b.disk.load()
		if err != nil {
			return nil, err
		}
		b.st, b.loaded = st, id
	}
	return b.st, nil
}

func validName(name string) error {
	if name == "" || len(name) > 128 {
		return errdefs.Invalid("secret name must be 1 to 128 characters")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return errdefs.Invalid("secret name %q may contain only letters, digits, '_', '-' and '.'", name)
		}
	}
	return nil
}

func normalizeHosts(hosts []string) ([]string, error) {
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		n := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
		if n == "" || len(n) > 253 || strings.ContainsAny(n, " /:@*") && net.ParseIP(n) == nil {
			return nil, errdefs.Invalid("bad host %q", h)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Set stores or rotates a secret: exactly one of Value and Command.
func (b *Broker) Set(req credapi.SecretSetRequest) error {
	if err := validName(req.Name); err != nil {
		return err
	}
	switch {
	case (req.Value == "") == (req.Command == ""):
		return errdefs.Invalid("secret %s: give either a value or a command", req.Name)
	case len(req.Value) > maxValueBytes:
		return errdefs.Invalid("secret %s: value is larger than %d bytes", req.Name, maxValueBytes)
	case len(req.Command) > maxCommandBytes:
		return errdefs.Invalid("secret %s: command is longer than %d bytes", req.Name, maxCommandBytes)
	}
	hosts, err := credapi.NormalizeStoredHosts(req.Hosts)
	if err != nil {
		return fmt.Errorf("secret %s: %w", req.Name, err)
	}
	err = b.update(func(st *state) error {
		st.Secrets[req.Name] = secretRecord{Value: req.Value, Command: req.Command, Hosts: hosts, Updated: b.cfg.Now().UTC()}
		return nil
	})
	if err == nil {
		b.log.Info().Str(logKeySecret, req.Name).Msg("secret set")
	}
	return err
}

// List describes every secret, never a value.
func (b *Broker) List() ([]credapi.SecretInfo, error) {
	st, err := b.current()
	if err != nil {
		return nil, err
	}
	out := make([]credapi.SecretInfo, 0, len(st.Secrets))
	for name, s := range st.Secrets {
		src := "value"
		if s.Command != "" {
			src = "command"
		}
		out = append(out, credapi.SecretInfo{Name: name, Hosts: slices.Clone(s.Hosts), Source: src, Updated: s.Updated})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove deletes a secret. Placeholders already minted from it keep their snapshot until their
// sandbox is forgotten.
func (b *Broker) Remove(name string) error {
	err := b.update(func(st *state) error {
		if _, ok := st.Secrets[name]; !ok {
			return errdefs.NotFound("no secret named %q (see `nexus secret ls`)", name)
		}
		delete(st.Secrets, name)
		return nil
	})
	if err == nil {
		b.log.Info().Str(logKeySecret, name).Msg("secret removed")
	}
	return err
}

// Mint issues the sandbox's placeholders, replacing any it had:
//   - one per (sandbox, host) as NEXUS_CRED_<HOST>_TOKEN, bound to that host, with
//     NEXUS_CRED_<HOST>_EXPIRES_AT=2099-12-31T23:59:59Z;
//   - for a binding with a kind (GH_TOKEN, ANTHROPIC_AUTH_TOKEN, OPENAI_API_KEY) or an Env name,
//     one more placeholder bound to all of the binding's hosts (gh sends GH_TOKEN to both
//     api.github.com and uploads.github.com).
func (b *Broker) Mint(req credapi.MintRequest) (credapi.MintResponse, error) {
	resp := credapi.MintResponse{Env: map[string]string{}}
	if req.SandboxID == "" {
		return resp, errdefs.Invalid("mint: no sandbox id")
	}
	type minted struct {
		hash   string
		header string
		rec    placeholderRecord
	}
	err := b.update(func(st *state) error {
		forgetLocked(st, req.SandboxID)
		seenHost := map[string]bool{}
		var out []minted
		now := b.cfg.Now().UTC()
		for _, bd := range req.Bindings {
			sec, ok := st.Secrets[bd.Secret]
			if !ok {
				return errdefs.NotFound("secret %q is not set (set it with `nexus secret set %s`)", bd.Secret, bd.Secret)
			}
			hosts, err := normalizeHosts(bd.Hosts)
			if err != nil {
				return fmt.Errorf("secret %s: %w", bd.Secret, err)
			}
			if len(hosts) == 0 { // the stored exact names (a wildcard names no host to mint for)
				hosts = slices.DeleteFunc(slices.Clone(sec.Hosts), func(h string) bool { return strings.HasPrefix(h, "*.") })
			}
			if len(hosts) == 0 {
				return errdefs.Invalid("secret %s is bound to no host (use --secret %s@host)", bd.Secret, bd.Secret)
			}
			// The stored hosts are the ceiling of every binding (the gateway checks who asks
			// for a secret stored without hosts).
			for _, h := range hosts {
				if len(sec.Hosts) > 0 && !credapi.WithinHosts(sec.Hosts, h) {
					return credapi.OutsideHostsError(bd.Secret, h, sec.Hosts)
				}
			}
			header, err := credapi.CredentialHeader(bd.Header)
			if err != nil {
				return fmt.Errorf("secret %s: %w", bd.Secret, err)
			}
			if _, ok := credapi.KindEnv[bd.Kind]; !ok && bd.Kind != credapi.KindGeneric {
				return errdefs.Invalid("secret %s: unknown credential kind %q", bd.Secret, bd.Kind)
			}
			mk := func(hs []string) (string, error) {
				p, err := newPlaceholder()
				if err != nil {
					return "", err
				}
				out = append(out, minted{hash: mitmapi.HashHex(p), header: header, rec: placeholderRecord{
					Sandbox: req.SandboxID, Hosts: slices.Clone(hs), Secret: bd.Secret,
					Value: sec.Value, Command: sec.Command, Minted: now,
				}})
				return p, nil
			}
			for _, h := range hosts {
				if seenHost[h] {
					return errdefs.Conflict("host %s is bound to two secrets; a host carries one credential", h)
				}
				seenHost[h] = true
				p, err := mk([]string{h})
				if err != nil {
					return err
				}
				prefix := credapi.HostEnvPrefix(h)
				resp.Env[prefix+"_TOKEN"] = p
				resp.Env[prefix+"_EXPIRES_AT"] = credapi.ExpiresAt
			}
			var vars []string
			if v := credapi.KindVar(bd.Kind, header); v != "" {
				vars = append(vars, v)
			}
			if bd.Env != "" && !slices.Contains(vars, bd.Env) {
				vars = append(vars, bd.Env)
			}
			if len(vars) > 0 {
				p, err := mk(hosts)
				if err != nil {
					return err
				}
				for _, v := range vars {
					if _, dup := resp.Env[v]; dup {
						return errdefs.Conflict("guest variable %s is seeded by two secrets", v)
					}
					resp.Env[v] = p
				}
			}
		}
		for _, m := range out {
			st.Placeholders[m.hash] = m.rec
			resp.Credentials = append(resp.Credentials, mitmapi.CredentialBinding{PlaceholderHash: m.hash, Hosts: slices.Clone(m.rec.Hosts), Header: m.header})
		}
		return nil
	})
	if err != nil {
		return credapi.MintResponse{}, err
	}
	b.log.Info().Str(logKeySandbox, req.SandboxID).Int("placeholders", len(resp.Credentials)).Msg("placeholders minted")
	return resp, nil
}

func newPlaceholder() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("mint: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Resolve returns the real credential behind placeholder, only when it was minted for sandboxID
// and is bound to host. Anything else is errdefs.ErrRefused with a message naming neither value.
func (b *Broker) Resolve(ctx context.Context, sandboxID, host, placeholder string) (string, error) {
	refused := errdefs.Refused("credential placeholder is not valid for this sandbox and host")
	st, err := b.current()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(strings.ToLower(placeholder)))
	b.mu.Lock()
	rec, ok := st.Placeholders[hex.EncodeToString(sum[:])]
	b.mu.Unlock()
	if !ok || rec.Sandbox != sandboxID {
		return "", refused
	}
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if !slices.Contains(rec.Hosts, h) {
		return "", refused
	}
	if rec.Command == "" {
		return rec.Value, nil
	}
	return b.runCommand(ctx, rec.Secret, rec.Command)
}

// runCommand runs a command secret on the host (sh -c) with a timeout and returns its trimmed
// stdout. Neither its output nor its stderr is ever logged or put in an error.
func (b *Broker) runCommand(ctx context.Context, name, command string) (string, error) {
	now := b.cfg.Now()
	if b.cfg.CommandCacheTTL > 0 {
		b.cmdMu.Lock()
		r, ok := b.cmdCache[command]
		b.cmdMu.Unlock()
		if ok && now.Before(r.expires) {
			return r.out, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	var stdout limitedBuffer
	stdout.max = maxOutputBytes
	cmd.Stdout = &stdout
	cmd.Stderr = nil
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return "", errdefs.Unavailable("secret %s: its command did not finish within %s", name, b.cfg.CommandTimeout)
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", errdefs.Unavailable("secret %s: its command failed with exit code %d", name, ee.ExitCode())
		}
		return "", errdefs.Unavailable("secret %s: its command could not run", name)
	}
	if stdout.over {
		return "", errdefs.Unavailable("secret %s: its command printed more than %d bytes", name, maxOutputBytes)
	}
	out := strings.TrimSpace(stdout.String())
	if out == "" {
		return "", errdefs.Unavailable("secret %s: its command printed nothing", name)
	}
	if b.cfg.CommandCacheTTL > 0 {
		b.cmdMu.Lock()
		b.cmdCache[command] = cmdResult{out: out, expires: now.Add(b.cfg.CommandCacheTTL)}
		b.cmdMu.Unlock()
	}
	return out, nil
}

// Forget drops every placeholder of a sandbox (at removal).
func (b *Broker) Forget(sandboxID string) error {
	return b.update(func(st *state) error {
		forgetLocked(st, sandboxID)
		return nil
	})
}

func forgetLocked(st *state, sandboxID string) {
	for k, r := range st.Placeholders {
		if r.Sandbox == sandboxID {
			delete(st.Placeholders, k)
		}
	}
}

type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if l.Len()+len(p) > l.max {
		l.over = true
		return len(p), nil
	}
	return l.Buffer.Write(p)
}
