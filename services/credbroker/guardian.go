package credbroker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/rs/zerolog"
)

// Claude Code's OAuth refresh defaults.
const (
	DefaultTokenURL = "https://console.anthropic.com/v1/oauth/token"
	// DefaultClientID is Claude Code's public OAuth client id.
	DefaultClientID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
)

// GuardianConfig configures a CredGuardian.
type GuardianConfig struct {
	// CredentialsPath is the host's ~/.claude/.credentials.json.
	CredentialsPath string
	TokenURL        string // default DefaultTokenURL
	ClientID        string // default DefaultClientID
	// PollInterval is how often the file is checked (default 1 minute).
	PollInterval time.Duration
	// RefreshBefore refreshes a token expiring within this window (default 30 minutes, Claude
	// Code's own threshold).
	RefreshBefore time.Duration
	HTTPClient    *http.Client
	Logger        zerolog.Logger
	Now           func() time.Time
}

// Guardian keeps the host's Claude Code OAuth token fresh. Any number of guardians (one per
// running sandbox, in any process) may watch the same file: refreshes are serialised by flock(2)
// on a sidecar lock file, and the loser re-reads the file after taking the lock and skips.
type Guardian struct {
	cfg GuardianConfig
	log zerolog.Logger
}

// NewGuardian checks the config and fills defaults.
func NewGuardian(cfg GuardianConfig) (*Guardian, error) {
	if cfg.CredentialsPath == "" {
		return nil, errors.New("cred guardian: no credentials path")
	}
	if cfg.TokenURL == "" {
		cfg.TokenURL = DefaultTokenURL
	}
	if cfg.ClientID == "" {
		cfg.ClientID = DefaultClientID
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Minute
	}
	if cfg.RefreshBefore <= 0 {
		cfg.RefreshBefore = 30 * time.Minute
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Guardian{cfg: cfg, log: cfg.Logger}, nil
}

// Run checks the file now and then every PollInterval until ctx ends. A failed check is logged
// (once while it keeps failing the same way) and retried at the next tick.
func (g *Guardian) Run(ctx context.Context) error {
	t := time.NewTicker(g.cfg.PollInterval)
	defer t.Stop()
	last := ""
	for {
		if _, err := g.Check(ctx); ctx.Err() == nil {
			last = g.report(err, last)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// report logs the outcome of a check unless it is the failure last logged, and returns what to
// pass next time. No credentials file means the user is not logged in to Claude: said once, at
// info, not a failure every minute.
func (g *Guardian) report(err error, last string) string {
	if err == nil {
		return ""
	}
	if msg := err.Error(); msg == last {
		return last
	}
	if errors.Is(err, fs.ErrNotExist) {
		g.log.Info().Str("path", g.cfg.CredentialsPath).Msg("no Claude credentials (not logged in to Claude?): nothing to refresh until they appear")
	} else {
		g.log.Warn().Str("path", g.cfg.CredentialsPath).Str("error", err.Error()).Msg("credential refresh failed")
	}
	return err.Error()
}

// oauthCreds is the part of the credentials file the guardian reads.
type oauthCreds struct {
	AccessToken  string `json:"accessToken"`
	RefreshToken string `json:"refreshToken"`
	ExpiresAt    int64  `json:"expiresAt"` // unix milliseconds
}

const oauthKey = "claudeAiOauth"

// readCreds parses the file, keeping every field it does not know.
func readCreds(path string) (top map[string]json.RawMessage, oauth map[string]json.RawMessage, c oauthCreds, mode os.FileMode, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, c, 0, fmt.Errorf("cred guardian: %w", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, c, 0, fmt.Errorf("cred guardian: %w", err)
	}
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, nil, c, 0, fmt.Errorf("cred guardian: %s is not JSON", path)
	}
	raw, ok := top[oauthKey]
	if !ok {
		return nil, nil, c, 0, fmt.Errorf("cred guardian: %s has no %s", path, oauthKey)
	}
	if err := json.Unmarshal(raw, &oauth); err != nil || oauth == nil {
		return nil, nil, c, 0, fmt.Errorf("cred guardian: %s: %s is not an object", path, oauthKey)
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, nil, c, 0, fmt.Errorf("cred guardian: %s: bad %s", path, oauthKey)
	}
	return top, oauth, c, st.Mode().Perm(), nil
}

func (g *Guardian) fresh(c oauthCreds) bool {
	return time.UnixMilli(c.ExpiresAt).After(g.cfg.Now().Add(g.cfg.RefreshBefore))
}

// Check refreshes the token when it expires within RefreshBefore. It reports whether this
// guardian did the refresh.
func (g *Guardian) Check(ctx context.Context) (bool, error) {
	path := g.cfg.CredentialsPath
	_, _, c, _, err := readCreds(path)
	if err != nil {
		return false, err
	}
	if g.fresh(c) {
		return false, nil
	}
	unlock, err := flockCtx(ctx, path+".lock")
	if err != nil {
		return false, err
	}
	defer unlock()
	// Another guardian may have refreshed while we waited for the lock.
	top, oauth, c, mode, err := readCreds(path)
	if err != nil {
		return false, err
	}
	if g.fresh(c) {
		return false, nil
	}
	if c.RefreshToken == "" {
		return false, fmt.Errorf("cred guardian: %s has no refresh token", path)
	}
	tok, err := g.refresh(ctx, c.RefreshToken)
	if err != nil {
		return false, err
	}
	set := func(k string, v any) {
		b, _ := json.Marshal(v)
		oauth[k] = b
	}
	set("accessToken", tok.AccessToken)
	if tok.RefreshToken != "" {
		set("refreshToken", tok.RefreshToken)
	}
	set("expiresAt", g.cfg.Now().Add(time.Duration(tok.ExpiresIn)*time.Second).UnixMilli())
	ob, err := json.Marshal(oauth)
	if err != nil {
		return false, fmt.Errorf("cred guardian: %w", err)
	}
	top[oauthKey] = ob
	out, err := json.Marshal(top)
	if err != nil {
		return false, fmt.Errorf("cred guardian: %w", err)
	}
	if err := atomicfile.WriteFile(path, out, mode); err != nil {
		return false, fmt.Errorf("cred guardian: %w", err)
	}
	g.log.Info().Str("path", path).Msg("claude OAuth token refreshed")
	return true, nil
}

type tokenResponse struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	ExpiresIn    int64  `json:"expires_in"`
}

// refresh performs the OAuth refresh_token grant. Errors name the status, never a token.
func (g *Guardian) refresh(ctx context.Context, refreshToken string) (tokenResponse, error) {
	var tr tokenResponse
	body, _ := json.Marshal(map[string]string{
		"grant_type":    "refresh_token",
		"refresh_token": refreshToken,
		"client_id":     g.cfg.ClientID,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.cfg.TokenURL, bytes.NewReader(body))
	if err != nil {
		return tr, fmt.Errorf("cred guardian: token endpoint: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.cfg.HTTPClient.Do(req)
	if err != nil {
		return tr, fmt.Errorf("cred guardian: token endpoint %s unreachable", g.cfg.TokenURL)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return tr, fmt.Errorf("cred guardian: token endpoint %s answered %d", g.cfg.TokenURL, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&tr); err != nil {
		return tr, fmt.Errorf("cred guardian: token endpoint %s sent an unreadable answer", g.cfg.TokenURL)
	}
	if tr.AccessToken == "" || tr.ExpiresIn <= 0 {
		return tr, fmt.Errorf("cred guardian: token endpoint %s sent no access token or expiry", g.cfg.TokenURL)
	}
	return tr, nil
}

// flockCtx takes an exclusive flock on path, giving up when ctx ends.
func flockCtx(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cred guardian: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("cred guardian: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("cred guardian: lock %s: %w", path, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
