package credbroker

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// A user not logged in to Claude (no credentials file) is told once, at info, not warned of a
// failed refresh every minute; a real failure is logged once while it repeats, and again after
// a success.
func TestGuardianQuietWhenNotLoggedIn(t *testing.T) {
	var logs bytes.Buffer
	g, err := NewGuardian(GuardianConfig{CredentialsPath: filepath.Join(t.TempDir(), ".credentials.json"), Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	last := ""
	for range 5 {
		_, err := g.Check(t.Context())
		last = g.report(err, last)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || strings.Contains(logs.String(), "warn") || !strings.Contains(logs.String(), "not logged in") {
		t.Fatalf("five checks without a credentials file logged %d lines:\n%s", n, logs.String())
	}
	logs.Reset()
	boom := errors.New("cred guardian: token endpoint said 500")
	last = g.report(boom, last)
	last = g.report(boom, last)
	last = g.report(nil, last)
	g.report(boom, last)
	if n := strings.Count(logs.String(), "credential refresh failed"); n != 2 {
		t.Fatalf("a repeated failure, a success, the failure again: %d warnings, want 2:\n%s", n, logs.String())
	}
}
