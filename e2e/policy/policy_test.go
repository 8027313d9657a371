package policy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
)

const (
	repoBox        = "pol-repo"   // --repo acme/app
	configBox      = "pol-config" // --config: api.github.com gated by paths only
	pushRefusal    = "nexus: refused: ref refs/heads/main not in allowed branches"
	graphQLRefusal = "nexus: refused: GitHub GraphQL is denied except the viewer { login } probe; use the REST API instead (for a pull request: gh api -X POST /repos/<owner>/<repo>/pulls)"
)

var boxes sync.Map // name → *boxOnce

type boxOnce struct {
	once sync.Once
	err  string
}

// box creates a shared nexus-base sandbox once per run; the stack's Stop removes it.
func box(t *testing.T, name string, args ...string) string {
	t.Helper()
	v, _ := boxes.LoadOrStore(name, &boxOnce{})
	b := v.(*boxOnce)
	b.once.Do(func() {
		start := time.Now()
		out, errOut, code := stack.Nexus(t, append([]string{"create", name, "--image", "nexus-base", "--memory", "512", "-l", "nexus-test=1"}, args...)...)
		if code != 0 {
			b.err = fmt.Sprintf("create %s: exit %d\nstdout: %s\nstderr: %s", name, code, out, errOut)
			return
		}
		t.Logf("created %s in %.1fs", name, time.Since(start).Seconds())
	})
	if b.err != "" {
		t.Fatal(b.err)
	}
	return name
}

func repoSandbox(t *testing.T) string { return box(t, repoBox, "--repo", "acme/app") }

func configSandbox(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(p, []byte(`version: 1
egress:
  policy:
    api.github.com:
      paths:
        - GET /user
  secrets:
    - name: GH_TOKEN
      hosts: [api.github.com]
`), 0o644)
	return box(t, configBox, "--config", p)
}

// sh runs a script in the guest and returns stdout+stderr and the exit code.
func sh(t *testing.T, name, script string) (string, int) {
	t.Helper()
	out, errOut, code := stack.Nexus(t, "exec", name, "--", "sh", "-c", script)
	return out + errOut, code
}

func mustSh(t *testing.T, name, script string) string {
	t.Helper()
	out, code := sh(t, name, script)
	if code != 0 {
		t.Fatalf("guest %s: %q: exit %d\n%s", name, script, code, out)
	}
	return strings.TrimSpace(out)
}

// curl runs curl in the guest and returns the status code and the body.
func curl(t *testing.T, name, args string) (string, string) {
	t.Helper()
	out, _ := sh(t, name, `rm -f /tmp/b; code=$(curl -sS -m 30 -o /tmp/b -w '%{http_code}' `+args+`); echo "$code"; cat /tmp/b 2>/dev/null`)
	status, body, _ := strings.Cut(out, "\n")
	return strings.TrimSpace(status), body
}

// waitDenied waits for a refusal of the sandbox in the audit stream.
func waitDenied(t *testing.T, name string, match func(audit.Event) bool) audit.Event {
	t.Helper()
	return waitEvent(t, name, true, match)
}

// waitEvent waits for an audit event of the sandbox (only refusals when denied).
func waitEvent(t *testing.T, name string, denied bool, match func(audit.Event) bool) audit.Event {
	t.Helper()
	args := []string{"audit", "tail", "--sandbox", name, "--json"}
	if denied {
		args = append(args, "--denied")
	}
	var found audit.Event
	err := testutil.Poll(15*time.Second, func() error {
		out := stack.MustNexus(t, args...)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var ev audit.Event
			if json.Unmarshal([]byte(line), &ev) == nil && match(ev) {
				found = ev
				return nil
			}
		}
		return fmt.Errorf("no matching refusal among:\n%s", out)
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func TestGitOverHTTPS(t *testing.T) {
	name := repoSandbox(t)
	mainBefore, err := hostGit(gh.bare("acme/app"), "rev-parse", "refs/heads/main")
	if err != nil {
		t.Fatal(err)
	}
	// Clone, fetch and push to nexus/feature of the bound repo, with the GH_TOKEN placeholder as
	// the credential: the mitm swaps it for the real token on github.com.
	head := mustSh(t, name, `set -e
git config --global user.name agent
git config --global user.email agent@example.com
git config --global http.extraHeader "Authorization: Bearer $GH_TOKEN"
rm -rf /root/app
git clone -q https://github.com/acme/app.git /root/app
cd /root/app
git fetch -q origin
echo change > f
git add f
git commit -q -m change
git push -q origin HEAD:refs/heads/nexus/feature
git rev-parse HEAD`)
	head = head[strings.LastIndexByte(head, '\n')+1:]
	got, err := hostGit(gh.bare("acme/app"), "rev-parse", "refs/heads/nexus/feature")
	if err != nil || got != head {
		t.Fatalf("bare repo nexus/feature = %q (%v), want the guest's %s", got, err, head)
	}
	reqs := gh.find("/acme/app")
	if len(reqs) == 0 {
		t.Fatal("github.com saw no request for acme/app")
	}
	for _, r := range reqs {
		if r.Auth != "Bearer "+ghToken {
			t.Fatalf("%s %s reached github.com with Authorization %q, want the swapped real token", r.Method, r.Path, redact(r.Auth))
		}
	}

	// A push to main is refused before it reaches the remote: the refusal travels in the 403
	// (git shows it with GIT_TRACE_CURL) and in the audit stream; the remote's refs are unchanged.
	out, code := sh(t, name, `cd /root/app && echo two > f && git commit -q -am two && GIT_TRACE_CURL=1 GIT_TRACE_CURL_NO_DATA=1 git push origin HEAD:main`)
	if code == 0 {
		t.Fatalf("push to main succeeded:\n%s", out)
	}
	if !strings.Contains(out, "X-Nexus-Deny: "+pushRefusal) {
		t.Fatalf("push to main: the refusal line is not in git's output:\n%s", out)
	}
	if after, _ := hostGit(gh.bare("acme/app"), "rev-parse", "refs/heads/main"); after != mainBefore {
		t.Fatalf("main moved %s → %s", mainBefore, after)
	}
	if refs, _ := hostGit(gh.bare("acme/app"), "for-each-ref", "--format=%(refname)"); refs != "refs/heads/main\nrefs/heads/nexus/feature" {
		t.Fatalf("bare repo refs changed: %q", refs)
	}
	ev := waitDenied(t, name, func(ev audit.Event) bool { return ev.Rule == "push_branch" })
	if ev.Reason != pushRefusal || ev.Status != 403 || ev.Host != "github.com" {
		t.Fatalf("audit event %+v", ev)
	}

	// A clone of a foreign repo is refused with a readable reason; github.com never hears of it.
	out, code = sh(t, name, `git clone https://github.com/evil/leak.git /root/leak`)
	if code == 0 || !strings.Contains(out, "403") ||
		!strings.Contains(out, "remote: nexus: refused: git over HTTPS to github.com/evil/leak is not allowed: this sandbox is bound to acme/app") {
		t.Fatalf("foreign clone: exit %d\n%s", code, out)
	}
	if r := gh.find("/evil/leak"); len(r) != 0 {
		t.Fatalf("github.com saw the foreign clone: %+v", r)
	}
}

func TestArchiveOfForeignRepo(t *testing.T) {
	name := repoSandbox(t)
	status, body := curl(t, name, `-H "Authorization: Bearer $GH_TOKEN" https://github.com/evil/leak/archive/refs/tags/v1.tar.gz`)
	if status != "200" || !strings.HasPrefix(body, "artifact of evil/leak: archive/refs/tags/v1.tar.gz") {
		t.Fatalf("archive: %s %q", status, body)
	}
	status, _ = curl(t, name, `-I -H "Authorization: Bearer $GH_TOKEN" https://github.com/evil/leak/releases/download/v1/leak.zip`)
	if status != "200" {
		t.Fatalf("release HEAD: %s", status)
	}
	reqs := append(gh.find("/evil/leak/archive/"), gh.find("/evil/leak/releases/")...)
	if len(reqs) != 2 {
		t.Fatalf("github.com saw %d artifact requests, want 2: %+v", len(reqs), reqs)
	}
	for _, r := range reqs {
		if r.Auth != "" {
			t.Fatalf("%s %s reached github.com with Authorization %q; the credential must be stripped", r.Method, r.Path, redact(r.Auth))
		}
	}
	ev := waitEvent(t, name, false, func(ev audit.Event) bool { return ev.Path == "/evil/leak/archive/refs/tags/v1.tar.gz" })
	if ev.Decision != audit.Allow || ev.Rule != "github_artifact" || ev.Swapped || ev.Status != 200 {
		t.Fatalf("archive audit event %+v", ev)
	}
	status, body = curl(t, name, `-X POST -d x https://github.com/evil/leak/archive/v1.zip`)
	if status != "403" || !strings.Contains(body, "only GET and HEAD are allowed there") {
		t.Fatalf("POST to an archive path: %s %q", status, body)
	}
}

// graphQLCarveOuts asserts the api.github.com probes of gh auth status work and every other
// GraphQL document is refused, in a sandbox whatever gates api.github.com.
func graphQLCarveOuts(t *testing.T, name string) {
	before := len(api.find("/graphql"))
	status, _ := curl(t, name, `-H "Authorization: Bearer $GH_TOKEN" https://api.github.com/`)
	if status != "200" {
		t.Fatalf("GET /: %s", status)
	}
	status, body := curl(t, name, `-H "Authorization: Bearer $GH_TOKEN" -H 'Content-Type: application/json' -d '{"query":"query UserCurrent{viewer{login}}"}' https://api.github.com/graphql`)
	if status != "200" || !strings.Contains(body, "nexus-bot") {
		t.Fatalf("viewer probe: %s %q", status, body)
	}
	for _, doc := range []string{
		`{"query":"mutation PullRequestCreate($input:CreatePullRequestInput!){createPullRequest(input:$input){pullRequest{url}}}","variables":{"input":{"title":"x"}}}`,
		`{"query":"{viewer{login email}}"}`,
		`{"query":"{viewer{login}}","query":"{repository(owner:\"evil\",name:\"leak\"){id}}"}`,
	} {
		status, body := curl(t, name, `-H "Authorization: Bearer $GH_TOKEN" -d '`+doc+`' https://api.github.com/graphql`)
		if status != "403" || strings.TrimSpace(body) != graphQLRefusal {
			t.Fatalf("GraphQL %s: %s %q", doc, status, body)
		}
	}
	got := api.find("/graphql")[before:]
	if len(got) != 1 || !strings.Contains(got[0].Body, "viewer{login}") {
		t.Fatalf("api.github.com saw GraphQL requests %+v, want the viewer probe only", got)
	}
	if got[0].Auth != "Bearer "+ghToken {
		t.Fatalf("viewer probe reached api.github.com with Authorization %q, want the swapped token", redact(got[0].Auth))
	}
}

func TestGraphQLRepoSandbox(t *testing.T) { graphQLCarveOuts(t, repoSandbox(t)) }

func TestRESTPulls(t *testing.T) {
	name := repoSandbox(t)
	status, body := curl(t, name, `-X POST -H "Authorization: Bearer $GH_TOKEN" -d '{"title":"t","head":"nexus/feature","base":"main"}' https://api.github.com/repos/acme/app/pulls`)
	if status != "201" || !strings.Contains(body, `"number":7`) {
		t.Fatalf("POST pulls: %s %q", status, body)
	}
	got := api.find("/repos/acme/app/pulls")
	if len(got) != 1 || got[0].Auth != "Bearer "+ghToken || !strings.Contains(got[0].Body, "nexus/feature") {
		t.Fatalf("api.github.com saw %+v", got)
	}
	status, _ = curl(t, name, `-X POST -H "Authorization: Bearer $GH_TOKEN" -d '{}' https://api.github.com/repos/evil/leak/pulls`)
	if status != "403" || len(api.find("/repos/evil/")) != 0 {
		t.Fatalf("POST pulls on a foreign repo: %s", status)
	}
}

func TestConfigPolicy(t *testing.T) {
	name := configSandbox(t)
	graphQLCarveOuts(t, name)
	status, body := curl(t, name, `-H "Authorization: Bearer $GH_TOKEN" https://api.github.com/user`)
	if status != "200" || !strings.Contains(body, "nexus-bot") {
		t.Fatalf("GET /user (paths rule): %s %q", status, body)
	}
	status, body = curl(t, name, `-H "Authorization: Bearer $GH_TOKEN" https://api.github.com/orgs/acme`)
	want := "nexus: refused: GET /orgs/acme on api.github.com matches no egress.policy rule (policy-gated hosts are default-deny; add a paths rule under egress.policy.api.github.com in .nexus/config.yaml)"
	if status != "403" || strings.TrimSpace(body) != want {
		t.Fatalf("GET /orgs/acme: %s %q", status, body)
	}
	if len(api.find("/orgs/")) != 0 {
		t.Fatal("api.github.com saw a refused request")
	}
	// github.com is not in this sandbox's perimeter at all.
	if status, _ := curl(t, name, `https://github.com/acme/app/archive/main.zip`); status == "200" {
		t.Fatal("github.com reachable from a sandbox whose config does not name it")
	}
}

func TestExplain(t *testing.T) {
	name := repoSandbox(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"GET", "https://github.com/evil/leak.git/info/refs?service=git-upload-pack"}, []string{"DENY GET", "rule:       github_foreign_repo", "layer:      request"}},
		{[]string{"GET", "https://github.com/acme/app.git/info/refs?service=git-receive-pack"}, []string{"ALLOW GET", "github_smart_http", "credential: swapped GH_TOKEN"}},
		{[]string{"GET", "https://github.com/evil/leak/archive/v1.zip"}, []string{"ALLOW", "github_artifact", "credential: stripped"}},
		{[]string{"POST", "https://api.github.com/graphql", "--data", `{"query":"{viewer{login}}"}`}, []string{"ALLOW POST", "github_graphql_viewer"}},
		{[]string{"POST", "https://api.github.com/graphql", "--data", `{"query":"mutation{x}"}`}, []string{"DENY POST", "reason:     " + graphQLRefusal}},
		{[]string{"GET", "https://evil.example/"}, []string{"DENY GET", "layer:      host", "rule:       host_not_allowed"}},
	} {
		out, errOut, code := stack.Nexus(t, append([]string{"egress", "explain", name}, tc.args...)...)
		if want := map[bool]int{true: 1, false: 0}[strings.HasPrefix(tc.want[0], "DENY")]; code != want {
			t.Errorf("explain %v: exit %d, want %d (1 on DENY)\n%s", tc.args, code, want, errOut)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("explain %v: output lacks %q:\n%s", tc.args, w, out)
			}
		}
	}
	if len(gh.find("/evil/leak.git")) != 0 {
		t.Fatal("explain sent a request")
	}
}

func TestConfigConflict(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(p, []byte("version: 1\negress:\n  allow:\n    - GitHub.com\n  policy:\n    github.com:\n      repos: [acme/app]\n"), 0o644)
	want := `nexus config: host "github.com" is listed under egress.allow and egress.policy; a host can be open (allow) or policy-gated (policy/secrets), not both — remove it from egress.allow`
	for _, args := range [][]string{{"config", "check", p}, {"create", "--config", p, "pol-conflict", "-l", "nexus-test=1"}} {
		out, errOut, code := stack.Nexus(t, args...)
		if code != 2 || strings.TrimSpace(errOut) != want {
			t.Fatalf("nexus %v: exit %d\nstdout: %s\nstderr: %q", args, code, out, errOut)
		}
	}
	if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "pol-conflict") {
		t.Fatal("a refused config left a sandbox behind")
	}
}

// redact describes an Authorization value without printing any of its secret.
func redact(s string) string {
	scheme, rest, _ := strings.Cut(s, " ")
	switch {
	case s == "":
		return ""
	case rest == ghToken:
		return scheme + " <the real GH_TOKEN>"
	default:
		return fmt.Sprintf("%s <%d bytes>", scheme, len(rest))
	}
}
