package mitm

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/httppolicy"
)

// The request policy registered over the bus is what the proxy applies: paths rules gate a
// host default-deny, an allowed request still gets its placeholder swapped, a refusal is a 403
// with the engine's one-line reason that never reaches the upstream.
func TestRequestPolicyFromRegistration(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, echoAuth(&hits))
	wire := mitmapi.SandboxPolicy{
		ID:           testSandbox,
		TokenHash:    mitmapi.HashHex(testToken),
		AllowedHosts: []string{"api.example.com", "other.example.com"},
		Credentials:  []mitmapi.CredentialBinding{{PlaceholderHash: mitmapi.HashHex(placeholder), Hosts: []string{"api.example.com"}}},
		Requests:     &httppolicy.Policy{Hosts: []httppolicy.HostRules{{Host: "api.example.com", Paths: []string{"GET /v1/**"}}}},
	}
	hp, err := requestPolicy(wire)
	if err != nil || hp == nil {
		t.Fatalf("requestPolicy: %v %v", hp, err)
	}
	sb, err := NewSandbox(wire, hp)
	if err != nil {
		t.Fatal(err)
	}
	h.reg.Put(sb)
	c := h.client(t, testSandbox, testToken)

	resp, body := get(t, c, "https://api.example.com/v1/items", map[string]string{"Authorization": "Bearer " + placeholder})
	if resp.StatusCode != 200 || body != "auth=Bearer "+realToken {
		t.Fatalf("allowed path: %d %q", resp.StatusCode, body)
	}
	before := hits.Load()
	resp, body = get(t, c, "https://api.example.com/admin", map[string]string{"Authorization": "Bearer " + placeholder})
	want := "nexus: refused: GET /admin on api.example.com matches no egress.policy rule (policy-gated hosts are default-deny; add a paths rule under egress.policy.api.example.com in .nexus/config.yaml)"
	if resp.StatusCode != 403 || strings.TrimSpace(body) != want || resp.Header.Get(DenyHeader) != want {
		t.Fatalf("refused path: %d %q", resp.StatusCode, body)
	}
	if hits.Load() != before {
		t.Fatal("a refused request reached the upstream")
	}
	ev := h.waitEvent(t, ruleIs(httppolicy.RuleDefaultDeny))
	if ev.Decision != audit.Deny || ev.Reason != want || ev.Status != 403 {
		t.Fatalf("audit %+v", ev)
	}
	// The allowed request's audit event names the policy rule that allowed it.
	if ev := h.waitEvent(t, func(ev audit.Event) bool { return ev.Path == "/v1/items" }); ev.Rule != httppolicy.RulePath || !ev.Swapped {
		t.Fatalf("allowed audit %+v", ev)
	}
	// A host the policy does not name stays open, audited as before.
	if resp, _ := get(t, c, "https://other.example.com/anything", nil); resp.StatusCode != 200 {
		t.Fatalf("open host: %d", resp.StatusCode)
	}
	if ev := h.waitEvent(t, hostIs("other.example.com")); ev.Rule != RuleHostAllowed {
		t.Fatalf("open host audit %+v", ev)
	}
	// A re-registration applies to new tunnels.
	wire.Requests.Hosts[0].Paths = append(wire.Requests.Hosts[0].Paths, "POST /v1/upload")
	hp, _ = requestPolicy(wire)
	sb, _ = NewSandbox(wire, hp)
	h.reg.Put(sb)
	c = h.client(t, testSandbox, testToken) // open tunnels keep the policy they started with
	req, _ := http.NewRequest("POST", "https://api.example.com/v1/upload", strings.NewReader("payload"))
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST: %d %q", resp.StatusCode, b)
	}
}

func TestRequestPolicyWire(t *testing.T) {
	if hp, err := requestPolicy(mitmapi.SandboxPolicy{ID: "x"}); hp != nil || err != nil {
		t.Fatalf("no policy: %v %v", hp, err)
	}
	if hp, err := requestPolicy(mitmapi.SandboxPolicy{ID: "x", Requests: &httppolicy.Policy{}}); hp != nil || err != nil {
		t.Fatalf("empty policy: %v %v", hp, err)
	}
	if _, err := requestPolicy(mitmapi.SandboxPolicy{ID: "x", Requests: &httppolicy.Policy{Repos: []string{"not a repo"}}}); err == nil {
		t.Fatal("bad policy accepted")
	}
	hp, err := requestPolicy(mitmapi.SandboxPolicy{ID: "x", Requests: &httppolicy.Policy{Repos: []string{"acme/app"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method, url string
		v           Verdict
	}{
		{"GET", "https://github.com/evil/x.git/info/refs?service=git-upload-pack", Verdict{Deny: true, Rule: httppolicy.RuleForeignRepo}},
		{"GET", "https://github.com/evil/x/archive/v1.zip", Verdict{Rule: httppolicy.RuleArtifact, StripCredential: true}},
		{"GET", "https://api.github.com/", Verdict{Rule: httppolicy.RuleAPIRoot}},
		{"GET", "https://registry.npmjs.org/x", Verdict{}},
	} {
		r, _ := http.NewRequest(tc.method, tc.url, nil)
		v := hp.Decide(r, r.URL.Hostname())
		v.Reason = ""
		if v != tc.v {
			t.Errorf("%s %s: %+v, want %+v", tc.method, tc.url, v, tc.v)
		}
	}
}
