package cli

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

func gitRepo(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "repo")
	os.MkdirAll(dir, 0o755)
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "README"}, {"commit", "-qm", "initial"}} {
		if args[0] == "add" {
			os.WriteFile(filepath.Join(dir, "README"), []byte("hello\n"), 0o644)
		}
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	return dir
}

// TestDelegateCommands drives a delegation with `nexus delegate create|poll|teardown`, human
// and --json, on the same gateway API as the MCP tools.
func TestDelegateCommands(t *testing.T) {
	st := newGatewayStack(t)
	repo := gitRepo(t)

	out := st.must(t, "delegate", "create", repo, "--name", "cli1", "--image", "nexus-mini")
	wtPath := filepath.Join(string(st.bus.Home), "worktrees", "cli1")
	if !strings.HasPrefix(out, "default/cli1 running in ") || !strings.Contains(out, "worktree "+wtPath+" on branch nexus/cli1 (from ") {
		t.Errorf("create: %q", out)
	}
	var wt api.WorktreeResult
	if err := json.Unmarshal([]byte(st.must(t, "--json", "delegate", "create", repo, "--name", "cli2", "--image", "nexus-mini")), &wt); err != nil {
		t.Fatal(err)
	}
	if wt.Sandbox != "default/cli2" || wt.Branch != "nexus/cli2" || wt.Record == nil || wt.Record.Labels[api.DelegateLabel] != "cli2" {
		t.Errorf("create --json: %+v", wt)
	}
	if _, err := st.run(t, "delegate", "create", repo, "--name", "cli1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second create of cli1: %v", err)
	}

	os.WriteFile(filepath.Join(wtPath, "dirty.txt"), []byte("x\n"), 0o644)
	out = st.must(t, "delegate", "poll", "cli1")
	for _, want := range []string{"sandbox:  default/cli1\n", "branch:   nexus/cli1\n", "status:   1 changed\n", "  ?? dirty.txt\n", "commits:\n", " initial\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("poll lacks %q:\n%s", want, out)
		}
	}
	before, after := st.must(t, "--json", "delegate", "poll", "cli1"), st.must(t, "delegate", "poll", "cli1", "--json")
	if before != after {
		t.Errorf("--json before and after the command differ:\n%s\n%s", before, after)
	}
	var poll api.PollResult
	if err := json.Unmarshal([]byte(after), &poll); err != nil || !poll.Dirty || len(poll.Log) != 1 || poll.Branch != "nexus/cli1" {
		t.Errorf("poll --json: %+v (%v)", poll, err)
	}

	_, err := st.run(t, "delegate", "teardown", "cli1")
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "dirty.txt") || !strings.Contains(err.Error(), "--force") {
		t.Errorf("dirty teardown: %v", err)
	}
	out = st.must(t, "delegate", "teardown", "cli1", "--force")
	if !strings.HasPrefix(out, "default/cli1 removed with its worktree "+wtPath+"; branch nexus/cli1 kept at ") || !strings.Contains(out, "discarded: dirty.txt\n") {
		t.Errorf("teardown --force: %q", out)
	}
	if _, err := os.Stat(wtPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("worktree after teardown: %v", err)
	}
	var td api.TeardownResult
	if err := json.Unmarshal([]byte(st.must(t, "delegate", "teardown", "cli2", "--json")), &td); err != nil || td.Sandbox != "default/cli2" || td.Head != wt.Base {
		t.Errorf("teardown --json: %+v (%v)", td, err)
	}
	if _, err := st.run(t, "delegate", "poll", "cli2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("poll after teardown: %v", err)
	}
}
