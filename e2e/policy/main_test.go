// Package policy_test proves the request policies of issue 6 end to end on real guests: a whole
// nexus stack whose mitm reaches a fake github.com and api.github.com on loopback (--resolve,
// TLS from a test CA given with --extra-ca). The fake github.com serves real bare repositories
// through `git http-backend`; guests run the real git and curl of nexus-base.
package policy_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

var (
	stack *testutil.Stack
	gh    *fakeGitHub // github.com
	api   *fakeAPI    // api.github.com
	// ghToken is the real GH_TOKEN the stack's secret store holds; guests only see a placeholder.
	ghToken string
	// gitEnv runs the host's git on the fake's bare repos.
	gitEnv []string
)

func TestMain(m *testing.M) {
	if _, err := exec.LookPath("git"); err != nil {
		fmt.Fprintln(os.Stderr, "policy tests need git on the host:", err)
		os.Exit(1)
	}
	testutil.Main(m, &stack, testutil.Setup(setup), testutil.Started(storeToken), testutil.Check(tokenNotLogged))
}

// setup starts the fake github.com (with its bare repos) and api.github.com.
func setup(f *testutil.Fixture) error {
	gitEnv = append(os.Environ(), "HOME="+f.Dir, "XDG_CONFIG_HOME="+f.Dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	pki, err := testutil.NewPKI("github.com", "api.github.com")
	if err != nil {
		return fmt.Errorf("test pki: %w", err)
	}
	caFile, err := pki.WriteCA(f.Dir)
	if err != nil {
		return err
	}
	if gh, err = startGitHub(filepath.Join(f.Dir, "repos"), pki.ServerConfig()); err != nil {
		return err
	}
	f.Cleanup(gh.close)
	for _, repo := range []string{"acme/app", "evil/leak"} {
		if err := gh.bareRepo(repo); err != nil {
			return err
		}
	}
	if api, err = startAPI(pki.ServerConfig()); err != nil {
		return err
	}
	f.Cleanup(api.close)
	f.Flags("--resolve="+gh.srv.Resolve()+","+api.srv.Resolve(), "--extra-ca="+caFile)
	return nil
}

// storeToken puts a real-looking GH_TOKEN in the stack's secret store.
func storeToken(s *testutil.Stack) error {
	b := make([]byte, 20)
	rand.Read(b)
	ghToken = "ghp_" + hex.EncodeToString(b)
	if _, errOut, code := s.NexusIn(nopTB{}, []byte(ghToken+"\n"), "secret", "set", "GH_TOKEN", "--host", "api.github.com,uploads.github.com,github.com"); code != 0 {
		return fmt.Errorf("secret set GH_TOKEN: %s", errOut)
	}
	return nil
}

// tokenNotLogged fails the run when the real GH_TOKEN appears in the stack's log.
func tokenNotLogged(s *testutil.Stack) error {
	if strings.Contains(s.Log(), ghToken) {
		return errors.New("the real GH_TOKEN appears in the nexus up log")
	}
	return nil
}

// nopTB lets TestMain use the stack's CLI helper.
type nopTB struct{ testing.TB }

func (nopTB) Helper() {}
