package mitm

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/mitm/internal/http1"
)

// judgeFixture judges requests of testSandbox directly, without a network: the proxy's checks
// over a parsed request in a tunnel to tunnelHost.
type judgeFixture struct {
	p        *Proxy
	sb       *Sandbox
	resolves atomic.Int64
	policies atomic.Int64
	resolve  func() (string, error)
}

func newJudgeFixture(t testing.TB, policy HTTPPolicy) *judgeFixture {
	t.Helper()
	f := &judgeFixture{resolve: func() (string, error) { return realToken, nil }}
	p, err := newProxy(proxyConfig{CADir: t.TempDir(), Sandboxes: NewRegistry(), Logger: zerolog.Nop(),
		Resolver: ResolverFunc(func(context.Context, string, string, string) (string, error) {
			f.resolves.Add(1)
			return f.resolve()
		})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if policy != nil {
		inner := policy
		policy = HTTPPolicyFunc(func(r *http.Request, host string) Verdict {
			f.policies.Add(1)
			return inner.Decide(r, host)
		})
	}
	sb, err := NewSandbox(mitmapi.SandboxPolicy{
		ID: testSandbox, TokenHash: mitmapi.HashHex(testToken), AllowedHosts: []string{"api.example.com", "other.example.com"},
		Credentials: []mitmapi.CredentialBinding{{PlaceholderHash: mitmapi.HashHex(placeholder), Hosts: []string{"api.example.com"}}},
	}, policy)
	if err != nil {
		t.Fatal(err)
	}
	f.p, f.sb = p, sb
	return f
}

// state reads raw as the next request of a tunnel to host and returns it as the checks get it.
func (f *judgeFixture) state(t testing.TB, host, raw string) *reqState {
	t.Helper()
	req := &http1.Request{}
	if err := req.Read(bufio.NewReader(strings.NewReader(raw)), MaxRequestHeaderBytes); err != nil {
		t.Fatal(err)
	}
	sess := &session{sb: f.sb, host: host, port: "443", addr: host + ":443", scheme: "https", allowed: f.sb.Allowed.Match(host)}
	return &reqState{sess: sess, req: req, path: req.URL.Path, rewrite: http1.Rewrite{DefaultHost: sess.addr}}
}

// TestChecksInOrder: a request that several checks would refuse is refused by the first of them,
// with that check's audit rule, and the later ones (the request policy, the credential resolve)
// are never asked.
func TestChecksInOrder(t *testing.T) {
	deny := HTTPPolicyFunc(func(*http.Request, string) Verdict { return Verdict{Deny: true} })
	leak := "X-Token: " + placeholder + "\r\n" // bound to api.example.com only
	bearer := "Authorization: Bearer " + placeholder + "\r\n"
	for _, c := range []struct {
		name, host, raw string
		policy          HTTPPolicy
		resolve         error
		rule            string
		policyAsked     bool
		resolveAsked    bool
	}{
		{"CONNECT first", "evil.example.net", "CONNECT other.example.com:443 HTTP/1.1\r\nHost: x\r\n" + leak + "\r\n", deny, nil, RuleBadRequest, false, false},
		{"host before Host field", "evil.example.net", "GET / HTTP/1.1\r\nHost: other.example.com\r\n" + leak + "\r\n", deny, nil, RuleHostNotAllowed, false, false},
		{"Host field before placeholders", "other.example.com", "GET / HTTP/1.1\r\nHost: api.example.com\r\n" + leak + "\r\n", deny, nil, RuleHostMismatch, false, false},
		{"placeholders before the policy", "other.example.com", "GET / HTTP/1.1\r\nHost: other.example.com\r\n" + leak + "\r\n", deny, nil, RulePlaceholderLeak, false, false},
		{"policy before the swap", "api.example.com", "GET / HTTP/1.1\r\nHost: api.example.com\r\n" + bearer + "\r\n", deny, nil, RuleHTTPPolicy, true, false},
		{"swap refused", "api.example.com", "GET / HTTP/1.1\r\nHost: api.example.com\r\n" + bearer + "\r\n", nil, errdefs.Refused("no"), RuleCredRefused, false, true},
		{"swap unavailable", "api.example.com", "GET / HTTP/1.1\r\nHost: api.example.com\r\n" + bearer + "\r\n", nil, errors.New("credbroker down"), RuleCredUnavailable, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newJudgeFixture(t, c.policy)
			f.resolve = func() (string, error) { return "", c.resolve }
			v := f.p.judge(f.state(t, c.host, c.raw))
			if v == nil || v.rule != c.rule {
				t.Fatalf("verdict %+v, want rule %s", v, c.rule)
			}
			if asked := f.policies.Load() > 0; asked != c.policyAsked {
				t.Fatalf("request policy asked: %v, want %v", asked, c.policyAsked)
			}
			if asked := f.resolves.Load() > 0; asked != c.resolveAsked {
				t.Fatalf("credential resolved: %v, want %v", asked, c.resolveAsked)
			}
		})
	}
}

// TestChecksAllowAndSwap: a request every check lets pass goes on with its bearer placeholder
// swapped, and a policy that allows it names the audit rule.
func TestChecksAllowAndSwap(t *testing.T) {
	allow := HTTPPolicyFunc(func(*http.Request, string) Verdict { return Verdict{Rule: "github_repo_rest"} })
	f := newJudgeFixture(t, allow)
	rs := f.state(t, "api.example.com", "GET /repos/a/b HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer "+placeholder+"\r\n\r\n")
	if v := f.p.judge(rs); v != nil {
		t.Fatalf("refused: %+v", v)
	}
	if rs.rewrite.Authorization != "Bearer "+realToken || !rs.swapped || rs.allowRule() != "github_repo_rest" {
		t.Fatalf("swapped %v, rule %s", rs.swapped, rs.allowRule())
	}
}

// TestChecksWithoutPolicyAllocateNothing: a sandbox without a request policy costs the checks
// no net/http.Request (nor anything else) per request; a swapped credential costs two strings
// (the placeholder it was found as and the header value sent instead).
func TestChecksWithoutPolicyAllocateNothing(t *testing.T) {
	f := newJudgeFixture(t, nil)
	for _, c := range []struct {
		name, raw string
		allocs    float64
	}{
		{"no credential", "GET /x HTTP/1.1\r\nHost: api.example.com\r\nAccept: */*\r\n\r\n", 0},
		{"bearer swapped", "GET /x HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer " + placeholder + "\r\n\r\n", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := f.state(t, "api.example.com", c.raw)
			fresh := *rs
			if v := f.p.judge(rs); v != nil { // warms the credential cache
				t.Fatalf("refused: %+v", v)
			}
			if n := testing.AllocsPerRun(100, func() {
				*rs = fresh
				f.p.judge(rs)
			}); n > c.allocs {
				t.Fatalf("%v allocations per request, want at most %v", n, c.allocs)
			}
		})
	}
}
