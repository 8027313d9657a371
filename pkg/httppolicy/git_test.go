package httppolicy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitEnv is an isolated environment for the git binary.
func gitEnv(t *testing.T) []string {
	home := t.TempDir()
	return append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
}

func git(t *testing.T, env []string, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustGit(t *testing.T, env []string, dir string, args ...string) string {
	t.Helper()
	out, err := git(t, env, dir, args...)
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

// bareRepo makes root/owner/name.git with one commit on main, pushable over HTTP.
func bareRepo(t *testing.T, env []string, root, owner, name string) string {
	t.Helper()
	bare := filepath.Join(root, owner, name+".git")
	mustGit(t, env, "", "init", "-q", "--bare", "-b", "main", bare)
	mustGit(t, env, bare, "config", "http.receivepack", "true")
	work := t.TempDir()
	mustGit(t, env, work, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(work, "README"), []byte(owner+"/"+name+"\n"), 0o644)
	mustGit(t, env, work, "add", "README")
	mustGit(t, env, work, "commit", "-q", "-m", "init")
	mustGit(t, env, work, "push", "-q", bare, "main")
	return bare
}

// TestRealGit runs the real git client through a server that applies the engine in front of
// git http-backend, the way the mitm applies it in front of github.com.
func TestRealGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	env := gitEnv(t)
	root := t.TempDir()
	bare := bareRepo(t, env, root, "acme", "app")
	bareRepo(t, env, root, "evil", "leak")
	eng, err := New(Policy{Repos: []string{"acme/app"}})
	if err != nil {
		t.Fatal(err)
	}
	backend := &cgi.Handler{Path: mustLook(t, "git"), Args: []string{"http-backend"},
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	var denied []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := eng.Decide(r, "github.com")
		if !d.Allow {
			denied = append(denied, d.Reason)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Nexus-Deny", d.Reason)
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(d.Reason + "\n"))
			return
		}
		if len(r.TransferEncoding) > 0 {
			// CGI needs a length: buffer a chunked body (GitHub itself takes it as it is).
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
		}
		backend.ServeHTTP(w, r)
	}))
	defer srv.Close()

	work := t.TempDir()
	clone := filepath.Join(work, "app")
	mustGit(t, env, "", "clone", "-q", srv.URL+"/acme/app.git", clone)
	mustGit(t, env, clone, "fetch", "-q", "origin")
	os.WriteFile(filepath.Join(clone, "f"), []byte("change\n"), 0o644)
	mustGit(t, env, clone, "add", "f")
	mustGit(t, env, clone, "commit", "-q", "-m", "change")
	mustGit(t, env, clone, "push", "-q", "origin", "HEAD:refs/heads/nexus/feature")
	head := mustGit(t, env, clone, "rev-parse", "HEAD")
	if got := mustGit(t, env, bare, "rev-parse", "refs/heads/nexus/feature"); got != head {
		t.Fatalf("nexus/feature is %s, want %s", got, head)
	}
	mainBefore := mustGit(t, env, bare, "rev-parse", "refs/heads/main")

	// A push larger than http.postBuffer goes chunked after a probe request whose body is a
	// lone flush packet: both pass, and the pack streams through after the commands.
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i*7919 + i>>8) // incompressible enough to keep the pack large
	}
	os.WriteFile(filepath.Join(clone, "big.bin"), big, 0o644)
	mustGit(t, env, clone, "add", "big.bin")
	mustGit(t, env, clone, "commit", "-q", "-m", "big")
	mustGit(t, env, clone, "-c", "http.postBuffer=65536", "push", "-q", "origin", "HEAD:refs/heads/nexus/big")
	if got, want := mustGit(t, env, bare, "rev-parse", "refs/heads/nexus/big"), mustGit(t, env, clone, "rev-parse", "HEAD"); got != want {
		t.Fatalf("nexus/big is %s, want %s", got, want)
	}

	out, err := git(t, append(env, "GIT_TRACE_CURL=1", "GIT_TRACE_CURL_NO_DATA=1"), clone, "push", "origin", "HEAD:main")
	if err == nil {
		t.Fatalf("push to main succeeded:\n%s", out)
	}
	if !strings.Contains(out, "X-Nexus-Deny: nexus: refused: ref refs/heads/main not in allowed branches") {
		t.Fatalf("push to main: no refusal line in git's trace:\n%s", tail(out))
	}
	plain, _ := git(t, env, clone, "push", "origin", "HEAD:main")
	t.Logf("push to main, as git shows it:\n%s", plain)
	if after := mustGit(t, env, bare, "rev-parse", "refs/heads/main"); after != mainBefore {
		t.Fatalf("main moved %s → %s", mainBefore, after)
	}
	// Pushing a tag and a nexus branch at once is refused as a whole.
	mustGit(t, env, clone, "tag", "v1")
	if out, err := git(t, env, clone, "push", "origin", "HEAD:refs/heads/nexus/two", "v1"); err == nil {
		t.Fatalf("push with a tag succeeded:\n%s", out)
	}
	if _, err := git(t, env, bare, "rev-parse", "--verify", "-q", "refs/heads/nexus/two"); err == nil {
		t.Fatal("nexus/two was created by a refused push")
	}

	out, err = git(t, env, "", "clone", srv.URL+"/evil/leak.git", filepath.Join(work, "leak"))
	if err == nil || !strings.Contains(out, "403") {
		t.Fatalf("foreign clone: %v\n%s", err, out)
	}
	t.Logf("foreign clone, as git shows it:\n%s", out)
	t.Logf("refusals: %q", denied)
}

func mustLook(t *testing.T, bin string) string {
	p, err := exec.LookPath(bin)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}
