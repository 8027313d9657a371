package mitm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/home"
)

func newTestService(t *testing.T, h home.Dir, logs *testutil.SyncBuffer) *Service {
	t.Helper()
	s, err := New(Config{Home: h, Log: zerolog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.restore(); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSandboxRecordsOfAnEarlierBuild: the sandbox policies a previous build stored
// ($NEXUS_HOME/mitm/<id>.json, compact JSON, beside its own .tmp leftovers) are served again
// after a restart, so its running sandboxes keep their egress; a damaged file costs only itself.
func TestSandboxRecordsOfAnEarlierBuild(t *testing.T) {
	h := home.Dir(t.TempDir())
	dir := filepath.Join(string(h), "mitm")
	if dir != h.MITMSandboxes() {
		t.Fatalf("records in %s, the earlier build's in %s", h.MITMSandboxes(), dir)
	}
	os.MkdirAll(dir, 0o700)
	old := `{"id":"sb-0123456789ab","token_hash":"` + mitmapi.HashHex(testToken) + `","allowed_hosts":["api.example.com"],` +
		`"credentials":[{"placeholder_hash":"` + mitmapi.HashHex(placeholder) + `","hosts":["api.example.com"]}]}`
	for name, body := range map[string]string{
		"sb-0123456789ab.json":     old,
		"sb-0123456789ab.json.tmp": old, // an interrupted write of that build
		"sb-damaged.json":          `{"id":`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	logs := &testutil.SyncBuffer{}
	s := newTestService(t, h, logs)
	sb, err := s.reg.Lookup(context.Background(), "sb-0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	if !sb.tokenOK(testToken) || !sb.Allowed.Match("api.example.com") || sb.Allowed.Match("other.example.com") {
		t.Fatal("the stored policy was not restored as registered")
	}
	if hosts, ok := sb.placeholder(placeholder); !ok || !hosts.Match("api.example.com") {
		t.Fatal("the stored credential binding was not restored")
	}
	if _, err := s.reg.Lookup(context.Background(), "sb-damaged"); err == nil {
		t.Fatal("a damaged record was registered")
	}
	if !strings.Contains(logs.String(), `"skipped":2`) {
		t.Fatalf("the damaged record and the leftover were not counted: %s", logs.String())
	}
}

// TestSandboxRecordsSurviveRestart: a registered sandbox is served by the next run; a forgotten
// one is not.
func TestSandboxRecordsSurviveRestart(t *testing.T) {
	h := home.Dir(t.TempDir())
	s := newTestService(t, h, &testutil.SyncBuffer{})
	for _, id := range []string{"sb-kept", "sb-gone"} {
		if err := s.register(mitmapi.SandboxPolicy{ID: id, TokenHash: mitmapi.HashHex(testToken), AllowedHosts: []string{"api.example.com"}}); err != nil {
			t.Fatal(err)
		}
	}
	s.forget("sb-gone")
	again := newTestService(t, h, &testutil.SyncBuffer{})
	if _, err := again.reg.Lookup(context.Background(), "sb-kept"); err != nil {
		t.Fatalf("a registered sandbox after a restart: %v", err)
	}
	if _, err := again.reg.Lookup(context.Background(), "sb-gone"); err == nil {
		t.Fatal("a forgotten sandbox came back after a restart")
	}
	if _, err := os.Stat(filepath.Join(h.MITMSandboxes(), "sb-kept.json")); err != nil {
		t.Fatalf("record file: %v", err)
	}
}
