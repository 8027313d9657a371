package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/gateway/mcp"
	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// fakeGateway answers get, list and create on the bus and records the creates it was asked.
type fakeGateway struct {
	mu      sync.Mutex
	creates []api.CreateRequest
}

type fixture struct {
	srv    *httptest.Server
	svc    *Service
	tokens map[Scope]string
	gw     *fakeGateway
	bus    *testutil.Bus
}

func newFixture(t *testing.T, edit ...func(*Config)) *fixture {
	t.Helper()
	b := testutil.NewBus(t)
	gw := &fakeGateway{}
	svc, err := bus.NewService(b.Connect(t, bus.UserGateway), bus.ServiceInfo{Name: "gateway", Version: "0.0.1", Host: bus.LocalHost}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(api.Get.Serve(svc, func(_ context.Context, r api.NameRequest) (*api.Sandbox, error) {
		if r.Name != "box" && r.Name != "p/box" {
			return nil, errdefs.NotFound("no sandbox %s", r.Name)
		}
		return &api.Sandbox{Name: "default/" + r.Name, State: api.StateRunning}, nil
	}))
	must(api.List.Serve(svc, func(_ context.Context, r api.ListRequest) (api.SandboxPage, error) {
		return []api.SandboxView{{Sandbox: api.Sandbox{Name: "default/box"}}}, nil
	}))
	must(api.Create.Serve(svc, func(_ context.Context, r api.CreateRequest) (*api.Sandbox, error) {
		gw.mu.Lock()
		gw.creates = append(gw.creates, r)
		gw.mu.Unlock()
		return &api.Sandbox{Name: "default/" + r.Name, Agent: r.Agent, State: api.StateRunning}, nil
	}))
	cfg := Config{Addr: "127.0.0.1:0", Home: b.Home, Log: zerolog.Nop(), Version: "test",
		Dial: func(ctx context.Context) (*nats.Conn, error) {
			return bus.Connect(ctx, bus.ConnectConfig{Home: b.Home, User: bus.UserAPI, URL: b.URL})
		}}
	for _, e := range edit {
		e(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: s, tokens: map[Scope]string{}, gw: gw, bus: b}
	for _, sc := range Scopes {
		secret, _, err := s.tokens.Create("t-"+string(sc), sc)
		if err != nil {
			t.Fatal(err)
		}
		f.tokens[sc] = secret
	}
	f.srv = httptest.NewServer(s.Handler())
	t.Cleanup(f.srv.Close)
	t.Cleanup(s.mcp.Close)
	t.Cleanup(func() {
		if s.audit != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s.audit.Close(ctx)
		}
	})
	return f
}

type answer struct {
	status int
	code   string
	msg    string
	body   string
}

func (f *fixture) do(t *testing.T, token, method, path, body string, hdr ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb ErrorBody
	json.Unmarshal(b, &eb)
	return answer{status: resp.StatusCode, code: eb.Error.Code, msg: eb.Error.Message, body: string(b)}
}

func TestGuard(t *testing.T) {
	f := newFixture(t)
	read := f.tokens[ScopeRead]
	cases := []struct {
		name        string
		token       string
		hdr         []string
		status      int
		code, inMsg string
	}{
		{"no token", "", nil, 401, "refused", "a valid API token is required"},
		{"unknown token", TokenPrefix + strings.Repeat("0", 64), nil, 401, "refused", "a valid API token is required"},
		{"not a token", "hunter2", nil, 401, "refused", "a valid API token is required"},
		{"rebound host", read, []string{"Host", "evil.example:80"}, 403, "refused", "not a loopback name"},
		{"foreign origin", read, []string{"Origin", "http://evil.example"}, 403, "refused", "cross-origin"},
		{"null origin", read, []string{"Origin", "null"}, 403, "refused", "cross-origin"},
		{"same origin", read, []string{"Origin", f.srv.URL}, 200, "", ""},
		{"no origin", read, nil, 200, "", ""},
		{"localhost host", read, []string{"Host", "localhost:1"}, 200, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := f.do(t, c.token, "GET", "/v1/sandboxes", "", c.hdr...)
			if a.status != c.status || a.code != c.code || !strings.Contains(a.msg, c.inMsg) {
				t.Fatalf("got %d %q %q, want %d %q containing %q", a.status, a.code, a.msg, c.status, c.code, c.inMsg)
			}
		})
	}
	t.Run("origin refused on the exec socket too", func(t *testing.T) {
		a := f.do(t, f.tokens[ScopeAdmin], "GET", "/v1/sandboxes/box/exec/ws?argv=true", "",
			"Origin", "http://evil.example", "Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		if a.status != 403 {
			t.Fatalf("cross-site WebSocket: %d %s", a.status, a.body)
		}
	})
	t.Run("revoked token", func(t *testing.T) {
		secret, _, err := f.svc.tokens.Create("gone", ScopeAdmin)
		if err != nil {
			t.Fatal(err)
		}
		if a := f.do(t, secret, "GET", "/v1/sandboxes", ""); a.status != 200 {
			t.Fatalf("before revoke: %d %s", a.status, a.body)
		}
		if err := f.svc.tokens.Revoke("gone"); err != nil {
			t.Fatal(err)
		}
		if a := f.do(t, secret, "GET", "/v1/sandboxes", ""); a.status != 401 {
			t.Fatalf("after revoke: %d %s", a.status, a.body)
		}
	})
}

func TestScopes(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name   string
		scope  Scope
		method string
		path   string
		body   string
		status int
		inMsg  string
	}{
		{"read may read", ScopeRead, "GET", "/v1/sandboxes/box", "", 200, ""},
		{"read may not create", ScopeRead, "POST", "/v1/sandboxes", `{"name":"x","agent":"codex"}`, 403, "token t-read has scope read: POST /v1/sandboxes needs scope write"},
		{"read may not remove", ScopeRead, "DELETE", "/v1/sandboxes/box", "", 403, "needs scope write"},
		{"write creates", ScopeWrite, "POST", "/v1/sandboxes", `{"name":"x","agent":"codex"}`, 201, ""},
		{"write may not mount", ScopeWrite, "POST", "/v1/sandboxes", `{"name":"x","agent":"codex","mounts":["/etc:/mnt"]}`, 403, "mounting host paths needs scope admin"},
		{"write may not bind secrets", ScopeWrite, "POST", "/v1/sandboxes", `{"name":"x","agent":"codex","secrets":["GH@github.com"]}`, 403, "binding secrets needs scope admin"},
		{"write may not claim user secrets", ScopeWrite, "POST", "/v1/sandboxes", `{"name":"x","agent":"codex","user_secrets":true}`, 403, "needs scope admin"},
		{"write may not live-mount ~/.claude", ScopeWrite, "POST", "/v1/sandboxes", `{"name":"x"}`, 403, "agent claude-code (it live-mounts the host's ~/.claude"},
		{"write may not read secrets", ScopeWrite, "GET", "/v1/secrets", "", 403, "needs scope admin"},
		{"write may not delegate", ScopeWrite, "POST", "/v1/delegations", `{"repo_path":"/"}`, 403, "needs scope admin"},
		{"admin mounts", ScopeAdmin, "POST", "/v1/sandboxes", `{"name":"x","mounts":["/etc:/mnt"]}`, 201, ""},
		{"not found", ScopeRead, "GET", "/v1/sandboxes/nope", "", 404, "no sandbox nope"},
		{"project name escaped", ScopeRead, "GET", "/v1/sandboxes/p%2Fbox", "", 200, ""},
		{"bad body", ScopeWrite, "POST", "/v1/sandboxes", `{"name":"x","agent":"codex","mount":["/"]}`, 400, "unknown field"},
		{"huge body", ScopeWrite, "POST", "/v1/sandboxes", `{"name":"` + strings.Repeat("x", maxJSONBody) + `"}`, 400, "larger than"},
		{"no route", ScopeRead, "GET", "/v1/nothing", "", 404, "no route"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := f.do(t, f.tokens[c.scope], c.method, c.path, c.body)
			if a.status != c.status || !strings.Contains(a.msg, c.inMsg) {
				t.Fatalf("got %d %q, want %d containing %q (%s)", a.status, a.msg, c.status, c.inMsg, a.body)
			}
		})
	}
	f.gw.mu.Lock()
	defer f.gw.mu.Unlock()
	for _, c := range f.gw.creates {
		if c.Progress != "" {
			t.Errorf("a caller chose the progress subject %q", c.Progress)
		}
	}
	if len(f.gw.creates) != 2 {
		t.Errorf("the gateway saw %d creates, want the 2 allowed", len(f.gw.creates))
	}
	// A write token's create may not reach the host's stored secrets (codex's OPENAI_API_KEY,
	// --repo's GH_TOKEN); an admin's may.
	for _, c := range f.gw.creates {
		if admin := len(c.Mounts) > 0; c.NoStoredSecrets == admin {
			t.Errorf("create %+v by admin=%v: no_stored_secrets=%v", c, admin, c.NoStoredSecrets)
		}
	}
}

// Every route of the document is served: none falls through to "no route".
func TestEveryDocumentedRouteIsServed(t *testing.T) {
	f := newFixture(t)
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	for p, ops := range doc.Paths {
		for m := range ops {
			path := strings.NewReplacer("{name}", "box", "{sandbox}", "box", "{snapshot}", "s", "{volume}", "v", "{image}", "i", "{secret}", "S").Replace(p)
			if strings.HasSuffix(path, "/exec/ws") {
				continue // needs an upgrade; TestGuard reaches it
			}
			a := f.do(t, f.tokens[ScopeAdmin], strings.ToUpper(m), path+"?path=/x&follow=false", "{}")
			if strings.Contains(a.msg, "no route") || a.status == http.StatusMethodNotAllowed {
				t.Errorf("%s %s is documented but not served: %d %s", strings.ToUpper(m), p, a.status, a.body)
			}
			n++
		}
	}
	if n < 30 {
		t.Fatalf("only %d routes in the document", n)
	}
}

func TestTokensAreStoredHashed(t *testing.T) {
	dir := testutil.IsolateHome(t)
	ts, err := OpenTokens(home.Dir(dir), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	secret, tok, err := ts.Create("ci", ScopeWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ts.Create("ci", ScopeRead); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a second token ci: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(TokenDir(home.Dir(dir)), "ci.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), secret) || strings.Contains(string(b), strings.TrimPrefix(secret, TokenPrefix)) || !strings.Contains(string(b), tok.Hash) {
		t.Fatalf("token record: %s", b)
	}
	if got, ok := ts.Lookup(secret); !ok || got.Name != "ci" || got.Scope != ScopeWrite {
		t.Fatalf("lookup: %+v %v", got, ok)
	}
	for _, bad := range []string{"", "Bad", "a/b", "-x", strings.Repeat("a", 64)} {
		if _, _, err := ts.Create(bad, ScopeRead); err == nil {
			t.Errorf("token name %q accepted", bad)
		}
	}
	if err := ts.Revoke("nope"); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("revoke of a missing token: %v", err)
	}
}

func TestBeyondLoopbackNeedsTLS(t *testing.T) {
	dir := testutil.IsolateHome(t)
	dial := func(context.Context) (*nats.Conn, error) { return nil, errdefs.Unavailable("no bus") }
	_, err := New(Config{Addr: "0.0.0.0:7477", Home: home.Dir(dir), Dial: dial, Log: zerolog.Nop()})
	if err == nil || Status(err) != 403 || !strings.Contains(err.Error(), "needs TLS") {
		t.Fatalf("0.0.0.0 without TLS: %v", err)
	}
	_, err = New(Config{Addr: "0.0.0.0:7477", Home: home.Dir(dir), Dial: dial, Log: zerolog.Nop(), TLSCert: "/nonexistent"})
	if err == nil || !strings.Contains(err.Error(), "both") {
		t.Fatalf("a cert without a key: %v", err)
	}
}

// MCP at /mcp with the same tokens: the tool set of gateway/mcp, each tool behind its scope.
func TestMCPOverHTTP(t *testing.T) {
	f := newFixture(t)
	connect := func(token string) *client.Client {
		c, err := client.NewStreamableHttpClient(f.srv.URL+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ctx := context.Background()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		init := mcpgo.InitializeRequest{}
		init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
		init.Params.ClientInfo = mcpgo.Implementation{Name: "test", Version: "1"}
		if _, err := c.Initialize(ctx, init); err != nil {
			t.Fatalf("initialize: %v", err)
		}
		return c
	}
	callTool := func(c *client.Client, name string, args map[string]any) *mcpgo.CallToolResult {
		req := mcpgo.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = name, args
		res, err := c.CallTool(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	text := func(res *mcpgo.CallToolResult) string {
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(mcpgo.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return b.String()
	}
	read := connect(f.tokens[ScopeRead])
	tools, err := read.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools.Tools {
		if _, ok := ToolScopes[tl.Name]; !ok {
			t.Logf("tool %s has no scope in ToolScopes: it needs admin until it is given one", tl.Name)
		}
	}
	if len(tools.Tools) < 13 {
		t.Fatalf("%d tools over HTTP", len(tools.Tools))
	}
	if res := callTool(read, mcp.ToolSandboxList, nil); res.IsError {
		t.Fatalf("sandbox_list with a read token: %s", text(res))
	}
	if res := callTool(read, mcp.ToolSandboxRemove, map[string]any{"name": "box"}); !res.IsError || !strings.Contains(text(res), "needs scope write") {
		t.Fatalf("sandbox_remove with a read token: %v %s", res.IsError, text(res))
	}
	write := connect(f.tokens[ScopeWrite])
	if res := callTool(write, mcp.ToolSandboxCreate, map[string]any{"name": "m", "agent": "claude-code"}); !res.IsError || !strings.Contains(text(res), "needs scope admin") {
		t.Fatalf("sandbox_create of claude-code with a write token: %v %s", res.IsError, text(res))
	}
	f.gw.mu.Lock()
	before := len(f.gw.creates)
	f.gw.mu.Unlock()
	if res := callTool(write, mcp.ToolSandboxCreate, map[string]any{"name": "m", "agent": "codex", "repos": []string{"o/r"}}); res.IsError {
		t.Fatalf("sandbox_create of codex with a write token: %s", text(res))
	}
	f.gw.mu.Lock()
	if len(f.gw.creates) != before+1 || !f.gw.creates[before].NoStoredSecrets {
		t.Errorf("a write token's MCP create reached the gateway without no_stored_secrets: %+v", f.gw.creates[before:])
	}
	f.gw.mu.Unlock()
	if res := callTool(write, mcp.ToolWorktreeCreate, map[string]any{"repo_path": "/"}); !res.IsError || !strings.Contains(text(res), "needs scope admin") {
		t.Fatalf("delegation with a write token: %v %s", res.IsError, text(res))
	}
	if _, err := client.NewStreamableHttpClient(f.srv.URL + "/mcp"); err != nil {
		t.Fatal(err)
	}
	if a := f.do(t, "", "POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); a.status != 401 {
		t.Fatalf("/mcp without a token: %d %s", a.status, a.body)
	}
}
