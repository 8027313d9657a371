package credbroker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
)

// Helper-process mode: the test binary re-executed by TestGuardianConcurrentProcesses runs one
// guardian check and exits.
const (
	helperEnv     = "NEXUS_TEST_GUARDIAN_HELPER"
	helperPathEnv = "NEXUS_TEST_GUARDIAN_PATH"
	helperURLEnv  = "NEXUS_TEST_GUARDIAN_URL"
	helperGoEnv   = "NEXUS_TEST_GUARDIAN_GO"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(guardianHelper())
	}
	os.Exit(m.Run())
}

func guardianHelper() int {
	// Wait for the go signal so all processes race for the lock together.
	goFile := os.Getenv(helperGoEnv)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(goFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			fmt.Println("error=no go signal")
			return 2
		}
		time.Sleep(2 * time.Millisecond)
	}
	g, err := NewGuardian(GuardianConfig{CredentialsPath: os.Getenv(helperPathEnv), TokenURL: os.Getenv(helperURLEnv), Logger: zerolog.Nop()})
	if err != nil {
		fmt.Println("error=" + err.Error())
		return 2
	}
	refreshed, err := g.Check(context.Background())
	if err != nil {
		fmt.Println("error=" + err.Error())
		return 1
	}
	fmt.Printf("refreshed=%v\n", refreshed)
	return 0
}

const (
	oldAccess  = "sk-ant-oat01-OLD-access"
	oldRefresh = "sk-ant-ort01-OLD-refresh"
	newAccess  = "sk-ant-oat01-NEW-access"
	newRefresh = "sk-ant-ort01-NEW-refresh"
)

// fakeTokenEndpoint answers the refresh_token grant and counts refreshes. It holds each answer
// briefly so competing guardians really overlap.
func fakeTokenEndpoint(t *testing.T, count *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body["grant_type"] != "refresh_token" || body["client_id"] == "" {
			http.Error(w, "bad grant", 400)
			return
		}
		if body["refresh_token"] != oldRefresh {
			http.Error(w, "refresh token already used", 400)
			return
		}
		count.Add(1)
		time.Sleep(50 * time.Millisecond) // a slow endpoint widens the race window
		json.NewEncoder(w).Encode(map[string]any{"access_token": newAccess, "refresh_token": newRefresh, "expires_in": 28800, "token_type": "Bearer"})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// writeCreds writes a credentials file expiring in d, with fields the guardian does not know.
func writeCreds(t *testing.T, d time.Duration) string {
	home := t.TempDir()
	t.Setenv("HOME", home)
	dir := filepath.Join(home, ".claude")
	os.MkdirAll(dir, 0o700)
	path := filepath.Join(dir, ".credentials.json")
	doc := map[string]any{
		"claudeAiOauth": map[string]any{
			"accessToken": oldAccess, "refreshToken": oldRefresh,
			"expiresAt": time.Now().Add(d).UnixMilli(), "scopes": []string{"user:inference"}, "subscriptionType": "max",
		},
		"mcpOAuth": map[string]any{"keep": "me"},
	}
	b, _ := json.Marshal(doc)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// watchTorn parses the file continuously until stop, failing on any torn observation.
func watchTorn(t *testing.T, path string) (stop func() int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	var torn atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			b, err := os.ReadFile(path)
			if err != nil {
				torn.Store(err.Error())
				return
			}
			var v map[string]json.RawMessage
			if err := json.Unmarshal(b, &v); err != nil || v["claudeAiOauth"] == nil {
				torn.Store(fmt.Sprintf("torn read (%d bytes)", len(b)))
				return
			}
			reads.Add(1)
		}
	}()
	return func() int {
		close(done)
		wg.Wait()
		if s, _ := torn.Load().(string); s != "" {
			t.Fatalf("credentials file: %s", s)
		}
		return int(reads.Load())
	}
}

func checkRefreshed(t *testing.T, path string) {
	t.Helper()
	top, _, c, mode, err := readCreds(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.AccessToken != newAccess || c.RefreshToken != newRefresh {
		t.Fatal("token not refreshed in the file")
	}
	if time.Until(time.UnixMilli(c.ExpiresAt)) < 7*time.Hour {
		t.Fatalf("expiresAt %v not ~8h ahead", time.UnixMilli(c.ExpiresAt))
	}
	if mode != 0o600 {
		t.Fatalf("file mode %v, want 0600 kept", mode)
	}
	if !strings.Contains(string(top["mcpOAuth"]), `"keep":"me"`) || !strings.Contains(string(top["claudeAiOauth"]), `"subscriptionType":"max"`) {
		t.Fatalf("unknown fields lost: %s", top["claudeAiOauth"])
	}
}

func TestGuardianSkipsFreshToken(t *testing.T) {
	var count atomic.Int64
	srv := fakeTokenEndpoint(t, &count)
	path := writeCreds(t, 2*time.Hour)
	g, _ := NewGuardian(GuardianConfig{CredentialsPath: path, TokenURL: srv.URL})
	if refreshed, err := g.Check(context.Background()); err != nil || refreshed || count.Load() != 0 {
		t.Fatalf("fresh token: refreshed=%v err=%v calls=%d", refreshed, err, count.Load())
	}
}

func TestGuardianRunRefreshesAndLogsNoToken(t *testing.T) {
	var count atomic.Int64
	srv := fakeTokenEndpoint(t, &count)
	path := writeCreds(t, 10*time.Minute)
	logs := &testutil.SyncBuffer{}
	g, _ := NewGuardian(GuardianConfig{CredentialsPath: path, TokenURL: srv.URL, PollInterval: 20 * time.Millisecond, Logger: zerolog.New(logs).Level(zerolog.TraceLevel)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for count.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// Several more polls pass without another refresh.
	polls := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(polls) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if count.Load() != 1 {
		t.Fatalf("%d refreshes, want 1", count.Load())
	}
	checkRefreshed(t, path)
	for _, s := range []string{oldAccess, oldRefresh, newAccess, newRefresh} {
		if strings.Contains(logs.String(), s) {
			t.Fatalf("logs contain a token: %s", logs.String())
		}
	}
}

func TestGuardianEndpointErrors(t *testing.T) {
	path := writeCreds(t, time.Minute)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"invalid_grant","echo":"`+oldRefresh+`"}`, 400)
	}))
	defer srv.Close()
	before, _ := os.ReadFile(path)
	g, _ := NewGuardian(GuardianConfig{CredentialsPath: path, TokenURL: srv.URL})
	_, err := g.Check(context.Background())
	if err == nil || !strings.Contains(err.Error(), "answered 400") || strings.Contains(err.Error(), oldRefresh) {
		t.Fatalf("err = %v", err)
	}
	after, _ := os.ReadFile(path)
	if string(before) != string(after) {
		t.Fatal("a failed refresh changed the file")
	}
}

// TestGuardianConcurrentGoroutines: 8 guardians (separate Guardian values and lock file
// descriptors) race on one expiring token: exactly one refresh, the file never torn.
func TestGuardianConcurrentGoroutines(t *testing.T) {
	var count atomic.Int64
	srv := fakeTokenEndpoint(t, &count)
	path := writeCreds(t, 5*time.Minute)
	stop := watchTorn(t, path)
	var wg sync.WaitGroup
	var winners atomic.Int64
	errs := make(chan error, 8)
	start := make(chan struct{})
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, _ := NewGuardian(GuardianConfig{CredentialsPath: path, TokenURL: srv.URL})
			<-start
			refreshed, err := g.Check(context.Background())
			if err != nil {
				errs <- err
			}
			if refreshed {
				winners.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	reads := stop()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if count.Load() != 1 || winners.Load() != 1 {
		t.Fatalf("%d refreshes at the endpoint, %d winners; want exactly 1", count.Load(), winners.Load())
	}
	checkRefreshed(t, path)
	t.Logf("%d consistent reads during the race", reads)
}

// TestGuardianConcurrentProcesses: the same race across 8 separate processes.
func TestGuardianConcurrentProcesses(t *testing.T) {
	var count atomic.Int64
	srv := fakeTokenEndpoint(t, &count)
	path := writeCreds(t, 5*time.Minute)
	goFile := filepath.Join(t.TempDir(), "go")
	stop := watchTorn(t, path)
	type result struct {
		out []byte
		err error
	}
	results := make(chan result, 8)
	for i := 0; i < 8; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=1", helperPathEnv+"="+path, helperURLEnv+"="+srv.URL, helperGoEnv+"="+goFile)
		go func() {
			out, err := cmd.Output()
			results <- result{out, err}
		}()
	}
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	winners := 0
	for i := 0; i < 8; i++ {
		r := <-results
		if r.err != nil {
			t.Fatalf("helper: %v: %s", r.err, r.out)
		}
		if strings.TrimSpace(string(r.out)) == "refreshed=true" {
			winners++
		}
	}
	reads := stop()
	if count.Load() != 1 || winners != 1 {
		t.Fatalf("%d refreshes at the endpoint, %d winning processes; want exactly 1", count.Load(), winners)
	}
	checkRefreshed(t, path)
	t.Logf("%d consistent reads during the race", reads)
}
