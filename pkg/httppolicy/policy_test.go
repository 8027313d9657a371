package httppolicy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/pktline"
)

const (
	oidA = "1111111111111111111111111111111111111111"
	oidB = "2222222222222222222222222222222222222222"
)

func pushBody(refs ...string) []byte {
	var b []byte
	for i, ref := range refs {
		line := oidA + " " + oidB + " " + ref
		if i == 0 {
			line += "\x00report-status side-band-64k"
		}
		b = pktline.AppendData(b, []byte(line+"\n"))
	}
	b = pktline.AppendFlush(b)
	return append(b, "PACK\x00\x00\x00\x02packdata"...)
}

func TestDecide(t *testing.T) {
	repoOnly := Policy{Repos: []string{"Acme/App"}}
	paths := Policy{Hosts: []HostRules{
		{Host: "api.example.com", Paths: []string{"GET /v1/**", "post /v1/items", "* /health"}},
		{Host: "api.github.com", Paths: []string{"GET /user"}},
		{Host: "github.com", Repos: []string{"acme/cfg"}},
	}}
	viewer := `{"query":"query UserCurrent{viewer{login}}"}`
	for _, tc := range []struct {
		name     string
		pol      Policy
		method   string
		url      string
		body     string
		header   map[string]string
		allow    bool
		strip    bool
		rule     string
		reason   string // exact, when set
		contains string
	}{
		// Open hosts.
		{name: "ungated host", pol: repoOnly, method: "POST", url: "https://registry.npmjs.org/x", allow: true, rule: RuleOpenHost},
		{name: "github open without repos", pol: Policy{}, method: "POST", url: "https://api.github.com/graphql", body: `{"query":"mutation{x}"}`, allow: true, rule: RuleOpenHost},
		{name: "codeload never gated by repos", pol: repoOnly, method: "GET", url: "https://codeload.github.com/x/y/tar.gz/main", allow: true, rule: RuleOpenHost},

		// github.com smart-HTTP.
		{name: "info/refs upload-pack bound", pol: repoOnly, method: "GET", url: "https://github.com/acme/app.git/info/refs?service=git-upload-pack", allow: true, rule: RuleSmartHTTP},
		{name: "info/refs receive-pack bound, case-insensitive", pol: repoOnly, method: "GET", url: "https://github.com/ACME/App/info/refs?service=git-receive-pack", allow: true, rule: RuleSmartHTTP},
		{name: "upload-pack bound", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-upload-pack", body: "0000", allow: true, rule: RuleSmartHTTP},
		{name: "dumb http refused", pol: repoOnly, method: "GET", url: "https://github.com/acme/app.git/info/refs", rule: RuleSmartHTTP},
		{name: "upload-pack by GET refused", pol: repoOnly, method: "GET", url: "https://github.com/acme/app.git/git-upload-pack", rule: RuleSmartHTTP},
		{name: "foreign clone", pol: repoOnly, method: "GET", url: "https://github.com/evil/leak.git/info/refs?service=git-upload-pack", rule: RuleForeignRepo,
			reason: "nexus: refused: git over HTTPS to github.com/evil/leak is not allowed: this sandbox is bound to acme/app (bind it with --repo evil/leak or repos under egress.policy.github.com in .nexus/config.yaml)"},
		{name: "foreign push", pol: repoOnly, method: "POST", url: "https://github.com/evil/leak/git-receive-pack", body: string(pushBody("refs/heads/nexus/x")), rule: RuleForeignRepo},
		{name: "foreign clone in other case", pol: Policy{Repos: []string{"acme/app"}, Hosts: []HostRules{{Host: "github.com", Paths: []string{"GET /**"}}}},
			method: "GET", url: "https://github.com/Evil/Leak.GIT/INFO/refs?service=git-upload-pack", rule: RuleForeignRepo},
		{name: "config repos on github.com", pol: paths, method: "GET", url: "https://github.com/acme/cfg/info/refs?service=git-upload-pack", allow: true, rule: RuleSmartHTTP},
		{name: "config repos do not bind api host", pol: paths, method: "GET", url: "https://api.github.com/repos/acme/cfg", rule: RuleDefaultDeny},

		// Pushes.
		{name: "push to nexus branch", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack", body: string(pushBody("refs/heads/nexus/feature")), allow: true, rule: RuleSmartHTTP},
		{name: "push deep nexus branch", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack", body: string(pushBody("refs/heads/nexus/a/b", "refs/heads/nexus/c")), allow: true, rule: RuleSmartHTTP},
		{name: "push to main", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack", body: string(pushBody("refs/heads/nexus/ok", "refs/heads/main")),
			rule: RulePushBranch, reason: "nexus: refused: ref refs/heads/main not in allowed branches"},
		{name: "push to bare nexus", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack", body: string(pushBody("refs/heads/nexus")),
			rule: RulePushBranch, reason: "nexus: refused: ref refs/heads/nexus not in allowed branches"},
		{name: "push a tag", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack", body: string(pushBody("refs/tags/v1")), rule: RulePushBranch},
		{name: "push custom branches", pol: Policy{Repos: []string{"acme/app"}, Branches: []string{"refs/heads/feat-*"}}, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack",
			body: string(pushBody("refs/heads/feat-1")), allow: true, rule: RuleSmartHTTP},
		{name: "push probe", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack", body: "0000", allow: true, rule: RuleSmartHTTP},
		{name: "push garbage", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack", body: "hello world", rule: RuleBadPush},
		{name: "push gzip", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack", body: string(pushBody("refs/heads/nexus/x")),
			header: map[string]string{"Content-Encoding": "gzip"}, rule: RuleCompressedBody},
		{name: "push placeholder-shaped ref redacted", pol: repoOnly, method: "POST", url: "https://github.com/acme/app.git/git-receive-pack",
			body: string(pushBody("refs/heads/" + strings.Repeat("ab", 32))), rule: RulePushBranch, reason: "nexus: refused: ref refs/heads/… not in allowed branches"},

		// Artifacts.
		{name: "foreign archive", pol: repoOnly, method: "GET", url: "https://github.com/other/lib/archive/refs/tags/v1.tar.gz", allow: true, strip: true, rule: RuleArtifact},
		{name: "foreign release HEAD", pol: repoOnly, method: "HEAD", url: "https://github.com/other/lib/releases/download/v1/lib.zip", allow: true, strip: true, rule: RuleArtifact},
		{name: "archive via paths-gated github", pol: paths, method: "GET", url: "https://github.com/x/y/archive/main.zip", allow: true, strip: true, rule: RuleArtifact},
		{name: "POST to archive", pol: repoOnly, method: "POST", url: "https://github.com/other/lib/archive/v1.zip", rule: RuleArtifactMethod},
		{name: "archive dir itself", pol: repoOnly, method: "GET", url: "https://github.com/other/lib/archive", rule: RuleDefaultDeny},
		{name: "web page of bound repo", pol: repoOnly, method: "GET", url: "https://github.com/acme/app", rule: RuleDefaultDeny},

		// api.github.com.
		{name: "api root", pol: repoOnly, method: "GET", url: "https://api.github.com/", allow: true, rule: RuleAPIRoot},
		{name: "api root via paths policy", pol: paths, method: "GET", url: "https://api.github.com/", allow: true, rule: RuleAPIRoot},
		{name: "api root POST", pol: repoOnly, method: "POST", url: "https://api.github.com/", rule: RuleDefaultDeny},
		{name: "graphql viewer", pol: repoOnly, method: "POST", url: "https://api.github.com/graphql", body: viewer, allow: true, rule: RuleGraphQLViewer},
		{name: "graphql viewer paths policy", pol: paths, method: "POST", url: "https://api.github.com/graphql", body: `{"query":"{ viewer { login } }","variables":{}}`, allow: true, rule: RuleGraphQLViewer},
		{name: "graphql pr create", pol: repoOnly, method: "POST", url: "https://api.github.com/graphql",
			body: `{"query":"mutation PullRequestCreate($input:CreatePullRequestInput!){createPullRequest(input:$input){pullRequest{url}}}","variables":{"input":{}}}`,
			rule: RuleGraphQL, reason: "nexus: refused: GitHub GraphQL is denied except the viewer { login } probe; use the REST API instead (for a pull request: gh api -X POST /repos/<owner>/<repo>/pulls)"},
		{name: "graphql extra field", pol: repoOnly, method: "POST", url: "https://api.github.com/graphql", body: `{"query":"{viewer{login email}}"}`, rule: RuleGraphQL},
		{name: "graphql GET", pol: repoOnly, method: "GET", url: "https://api.github.com/graphql?query=%7Bviewer%7Blogin%7D%7D", rule: RuleGraphQL},
		{name: "graphql query string", pol: repoOnly, method: "POST", url: "https://api.github.com/graphql?query=x", body: viewer, rule: RuleGraphQL},
		{name: "graphql gzip", pol: repoOnly, method: "POST", url: "https://api.github.com/graphql", body: viewer, header: map[string]string{"Content-Encoding": "gzip"}, rule: RuleGraphQL},
		{name: "graphql listed in paths still refused", pol: Policy{Hosts: []HostRules{{Host: "api.github.com", Paths: []string{"POST /graphql", "* /**"}}}},
			method: "POST", url: "https://api.github.com/graphql", body: `{"query":"{repository(owner:\"a\",name:\"b\"){id}}"}`, rule: RuleGraphQL},
		{name: "graphql variants held to the graphql rule", pol: Policy{Hosts: []HostRules{{Host: "api.github.com", Paths: []string{"* /**"}}}},
			method: "POST", url: "https://api.github.com/GraphQL/", body: `{"query":"{viewer{login}}"}`, rule: RuleGraphQL},
		{name: "graphql format suffix", pol: repoOnly, method: "POST", url: "https://api.github.com/graphql.json", body: `{"query":"{viewer{login}}"}`, rule: RuleGraphQL},
		{name: "graphqlx is not graphql", pol: Policy{Hosts: []HostRules{{Host: "api.github.com", Paths: []string{"GET /graphqlx"}}}},
			method: "GET", url: "https://api.github.com/graphqlx", allow: true, rule: RulePath},
		{name: "rest pulls bound", pol: repoOnly, method: "POST", url: "https://api.github.com/repos/acme/app/pulls", body: `{"title":"x"}`, allow: true, rule: RuleRepoREST},
		{name: "rest read bound", pol: repoOnly, method: "GET", url: "https://api.github.com/repos/acme/app/pulls/1", allow: true, rule: RuleRepoREST},
		{name: "rest pulls foreign", pol: repoOnly, method: "POST", url: "https://api.github.com/repos/evil/x/pulls", rule: RuleForeignRepo,
			contains: "POST /repos/evil/x on api.github.com: this sandbox is bound to acme/app (bind it with --repo evil/x"},
		{name: "rest delete repo", pol: repoOnly, method: "DELETE", url: "https://api.github.com/repos/acme/app", rule: RuleRepoWrite},
		{name: "rest move main", pol: repoOnly, method: "PATCH", url: "https://api.github.com/repos/acme/app/git/refs/heads/main", body: `{"sha":"x"}`, rule: RuleRepoWrite},
		{name: "rest commit contents", pol: repoOnly, method: "PUT", url: "https://api.github.com/repos/acme/app/contents/README", rule: RuleRepoWrite},
		{name: "rest merge", pol: repoOnly, method: "PUT", url: "https://api.github.com/repos/acme/app/pulls/3/merge", rule: RuleRepoWrite},
		{name: "rest pr edit", pol: repoOnly, method: "PATCH", url: "https://api.github.com/repos/acme/app/pulls/3", allow: true, rule: RuleRepoREST},
		{name: "rest pr comment", pol: repoOnly, method: "POST", url: "https://api.github.com/repos/acme/app/issues/3/comments", allow: true, rule: RuleRepoREST},
		{name: "rest foreign read stripped", pol: repoOnly, method: "GET", url: "https://api.github.com/repos/cli/cli/releases/latest", allow: true, strip: true, rule: RulePublicRead},
		{name: "rest user", pol: repoOnly, method: "GET", url: "https://api.github.com/user?case=swap", allow: true, rule: RuleRepoREST},
		{name: "rest user write", pol: repoOnly, method: "PATCH", url: "https://api.github.com/user", rule: RuleDefaultDeny},
		{name: "rest search not built in", pol: repoOnly, method: "GET", url: "https://api.github.com/search/code?q=x", rule: RuleDefaultDeny},
		{name: "paths-only api host has no built-in REST", pol: Policy{Hosts: []HostRules{{Host: "api.github.com", Paths: []string{"GET /x"}}}},
			method: "GET", url: "https://api.github.com/repos/cli/cli", rule: RuleDefaultDeny},
		{name: "rest user via paths", pol: paths, method: "GET", url: "https://api.github.com/user", allow: true, rule: RulePath},
		{name: "uploads asset bound", pol: repoOnly, method: "POST", url: "https://uploads.github.com/repos/acme/app/releases/12/assets?name=x.zip", allow: true, rule: RuleRepoREST},
		{name: "uploads asset foreign", pol: repoOnly, method: "POST", url: "https://uploads.github.com/repos/evil/app/releases/12/assets", rule: RuleDefaultDeny},

		// Generic paths.
		{name: "paths GET glob", pol: paths, method: "GET", url: "https://api.example.com/v1/a/b?x=1", allow: true, rule: RulePath, reason: "egress.policy api.example.com: GET /v1/**"},
		{name: "paths POST exact", pol: paths, method: "POST", url: "https://api.example.com/v1/items", allow: true, rule: RulePath},
		{name: "paths POST other", pol: paths, method: "POST", url: "https://api.example.com/v1/items/2", rule: RuleDefaultDeny,
			reason: "nexus: refused: POST /v1/items/2 on api.example.com matches no egress.policy rule (policy-gated hosts are default-deny; add a paths rule under egress.policy.api.example.com in .nexus/config.yaml)"},
		{name: "paths any method", pol: paths, method: "DELETE", url: "https://api.example.com/health", allow: true, rule: RulePath},
		{name: "paths dir itself not under **", pol: paths, method: "GET", url: "https://api.example.com/v1", rule: RuleDefaultDeny},
		{name: "dot segments", pol: paths, method: "GET", url: "https://api.example.com/v1/../admin", rule: RuleBadPath},
		{name: "encoded dot segments", pol: paths, method: "GET", url: "https://api.example.com/v1/%2e%2e/admin", rule: RuleBadPath},
		{name: "encoded slash", pol: paths, method: "GET", url: "https://api.example.com/v1/a%2Fb", rule: RuleBadPath},
		{name: "double slash", pol: paths, method: "GET", url: "https://api.example.com/v1//x", rule: RuleBadPath},
		{name: "host case", pol: paths, method: "GET", url: "https://API.Example.com/v1/x", allow: true, rule: RulePath},
		{name: "placeholder in path redacted", pol: paths, method: "GET", url: "https://api.example.com/x/" + strings.Repeat("0f", 32), rule: RuleDefaultDeny, contains: "GET /x/… on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(tc.pol)
			if err != nil {
				t.Fatal(err)
			}
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			r := httptest.NewRequest(tc.method, tc.url, body)
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			host := r.URL.Hostname()
			d := e.Decide(r, host)
			if d.Allow != tc.allow || d.StripCredential != tc.strip || d.Rule != tc.rule {
				t.Fatalf("decision %+v, want allow=%v strip=%v rule=%s", d, tc.allow, tc.strip, tc.rule)
			}
			if tc.reason != "" && d.Reason != tc.reason {
				t.Fatalf("reason\n got %q\nwant %q", d.Reason, tc.reason)
			}
			if tc.contains != "" && !strings.Contains(d.Reason, tc.contains) {
				t.Fatalf("reason %q does not contain %q", d.Reason, tc.contains)
			}
			if d.Reason == "" || strings.ContainsAny(d.Reason, "\r\n") || hexRun.MatchString(d.Reason) {
				t.Fatalf("reason must be one line without hex runs: %q", d.Reason)
			}
			// Whatever was read, the body still yields exactly the original bytes.
			if r.Body != nil {
				got, _ := io.ReadAll(r.Body)
				if string(got) != tc.body {
					t.Fatalf("body after Decide %q, want %q", got, tc.body)
				}
			}
		})
	}
}

// A push body is read only up to the end of its commands: the pack is streamed afterwards.
func TestPushReadsOnlyCommands(t *testing.T) {
	e, _ := New(Policy{Repos: []string{"acme/app"}})
	cmds := pushBody("refs/heads/nexus/x")
	cmds = cmds[:len(cmds)-len("PACK\x00\x00\x00\x02packdata")]
	pr, pw := io.Pipe()
	go func() { pw.Write(cmds) }() // the pack never comes until the decision is made
	r := httptest.NewRequest("POST", "https://github.com/acme/app.git/git-receive-pack", pr)
	d := e.Decide(r, "github.com")
	if !d.Allow {
		t.Fatalf("%+v", d)
	}
	go func() { pw.Write([]byte("PACKrest")); pw.Close() }()
	got, _ := io.ReadAll(r.Body)
	if !bytes.Equal(got, append(cmds, "PACKrest"...)) {
		t.Fatalf("forwarded %q", got)
	}
}

func TestNewRefuses(t *testing.T) {
	for _, p := range []Policy{
		{Repos: []string{"nope"}},
		{Hosts: []HostRules{{Host: "api.example.com", Repos: []string{"a/b"}}}},
		{Hosts: []HostRules{{Host: "bad host", Paths: []string{"GET /"}}}},
		{Hosts: []HostRules{{Host: "a.com", Paths: []string{"GET /x"}}, {Host: "A.com", Paths: []string{"GET /y"}}}},
		{Hosts: []HostRules{{Host: "a.com", Paths: []string{"FETCH /x"}}}},
		{Branches: []string{"heads/x"}},
	} {
		if _, err := New(p); err == nil {
			t.Errorf("New(%+v) accepted", p)
		}
	}
}

func TestNoBodyExplain(t *testing.T) {
	e, _ := New(Policy{Repos: []string{"acme/app"}})
	r, _ := http.NewRequest("POST", "https://github.com/acme/app.git/git-receive-pack", nil)
	if d := e.Decide(r, "github.com"); !d.Allow || !strings.Contains(d.Reason, "refs/heads/nexus/**") {
		t.Fatalf("%+v", d)
	}
	r, _ = http.NewRequest("POST", "https://api.github.com/graphql", nil)
	if d := e.Decide(r, "api.github.com"); d.Allow {
		t.Fatalf("%+v", d)
	}
}
