package policy_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/IniZio/nexus/internal/testutil"
)

// seen is one request that reached a fake upstream.
type seen struct {
	Method, Path, Auth, Body string
}

type recorder struct {
	mu   sync.Mutex
	reqs []seen
}

func (r *recorder) record(req *http.Request, body string) {
	r.mu.Lock()
	r.reqs = append(r.reqs, seen{Method: req.Method, Path: req.URL.RequestURI(), Auth: req.Header.Get("Authorization"), Body: body})
	r.mu.Unlock()
}

// find returns the requests whose path starts with prefix.
func (r *recorder) find(prefix string) []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []seen
	for _, s := range r.reqs {
		if strings.HasPrefix(s.Path, prefix) {
			out = append(out, s)
		}
	}
	return out
}

// fakeGitHub is github.com: real repositories over git smart-HTTP (git http-backend as CGI),
// archive and release downloads.
type fakeGitHub struct {
	recorder
	root    string
	srv     *testutil.Upstream
	backend *cgi.Handler
}

var smartRE = regexp.MustCompile(`^/([^/]+)/([^/]+?)(\.git)?/(info/refs|git-upload-pack|git-receive-pack)$`)

func startGitHub(root string, tc *tls.Config) (*fakeGitHub, error) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		return nil, err
	}
	g := &fakeGitHub{root: root, backend: &cgi.Handler{Path: gitBin, Args: []string{"http-backend"},
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}}
	g.srv, err = testutil.ServeUpstream("github.com", g, tc)
	return g, err
}

func (g *fakeGitHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.record(r, "")
	if m := smartRE.FindStringSubmatch(r.URL.Path); m != nil {
		r.URL.Path = "/" + m[1] + "/" + m[2] + ".git/" + m[4]
		g.backend.ServeHTTP(w, r)
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if len(parts) >= 4 && (parts[2] == "archive" || parts[2] == "releases") {
		w.Header().Set("Content-Type", "application/octet-stream")
		fmt.Fprintf(w, "artifact of %s/%s: %s\n", parts[0], parts[1], strings.Join(parts[2:], "/"))
		return
	}
	http.NotFound(w, r)
}

func (g *fakeGitHub) close() { g.srv.Close() }

func (g *fakeGitHub) bare(repo string) string { return filepath.Join(g.root, repo+".git") }

// bareRepo creates owner/name.git with one commit on main, pushable over HTTP.
func (g *fakeGitHub) bareRepo(repo string) error {
	bare := g.bare(repo)
	work, err := os.MkdirTemp("", "nexus-policy-work-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	os.WriteFile(filepath.Join(work, "README"), []byte(repo+"\n"), 0o644)
	for _, step := range [][]string{
		{"", "init", "-q", "--bare", "-b", "main", bare},
		{bare, "config", "http.receivepack", "true"},
		{work, "init", "-q", "-b", "main"},
		{work, "add", "README"},
		{work, "commit", "-q", "-m", "init " + repo},
		{work, "push", "-q", bare, "main"},
	} {
		if _, err := hostGit(step[0], step[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// hostGit runs the host's git.
func hostGit(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env = dir, gitEnv
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// fakeAPI is api.github.com.
type fakeAPI struct {
	recorder
	srv *testutil.Upstream
}

func startAPI(tc *tls.Config) (*fakeAPI, error) {
	a := &fakeAPI{}
	var err error
	a.srv, err = testutil.ServeUpstream("api.github.com", a, tc)
	return a, err
}

func (a *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	a.record(r, string(b))
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "GET" && r.URL.Path == "/":
		w.Header().Set("X-OAuth-Scopes", "repo, read:org") // the scopes gh auth status asks for
		fmt.Fprint(w, `{"current_user_url":"https://api.github.com/user"}`)
	case r.Method == "POST" && r.URL.Path == "/graphql":
		fmt.Fprint(w, `{"data":{"viewer":{"login":"nexus-bot"}}}`)
	case r.Method == "GET" && r.URL.Path == "/user":
		fmt.Fprint(w, `{"login":"nexus-bot"}`)
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/pulls"):
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"number":7}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"message":"Not Found"}`)
	}
}

func (a *fakeAPI) close() { a.srv.Close() }
