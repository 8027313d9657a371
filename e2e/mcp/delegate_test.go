package mcp_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

type worktreeResult struct {
	Sandbox  string `json:"sandbox"`
	Branch   string `json:"branch"`
	Worktree string `json:"worktree"`
}

type pollResult struct {
	Branch string   `json:"branch"`
	Log    []string `json:"log"`
	Status []string `json:"status"`
	Agent  string   `json:"agent"`
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(stack.Env, "GIT_AUTHOR_NAME=host", "GIT_AUTHOR_EMAIL=host@example.com", "GIT_COMMITTER_NAME=host", "GIT_COMMITTER_EMAIL=host@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return string(out)
}

// TestDelegation drives the worktree flow end to end with a scripted in-guest agent that reads
// its brief, writes a file and commits: create → dispatch → poll shows the commit (and the host
// branch has it) → teardown removes the sandbox and the worktree. Three delegations of one repo
// run side by side on their own branches: two driven by the MCP server, one by `nexus delegate`
// (the same gateway API).
func TestDelegation(t *testing.T) {
	stack.MustNexus(t, "image", "build", "nexus-base")
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)
	git(t, repo, "add", "README")
	git(t, repo, "commit", "-qm", "initial")
	c := mcpClient(t)

	agent := []string{"/bin/sh", "-c", `cat > agent.txt && git add agent.txt && git -c user.name=agent -c user.email=agent@example.com commit -qm "agent: $(head -c 40 agent.txt)"`}
	var wts []worktreeResult
	for _, name := range []string{"e2e-one", "e2e-two"} {
		var wt worktreeResult
		call(t, c, "delegate_worktree_create", map[string]any{"repo_path": repo, "name": name, "image": "nexus-base", "memory": 512}, &wt)
		if wt.Branch != "nexus/"+name {
			t.Fatalf("branch %q", wt.Branch)
		}
		t.Cleanup(func() { stack.Nexus(t, "rm", "--force", wt.Sandbox) })
		wts = append(wts, wt)
	}
	if wts[0].Worktree == wts[1].Worktree {
		t.Fatal("two delegations share a worktree")
	}
	var cliWT worktreeResult
	if err := json.Unmarshal([]byte(stack.MustNexus(t, "--json", "delegate", "create", repo, "--name", "e2e-cli", "--image", "nexus-base", "--memory", "512")), &cliWT); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", cliWT.Sandbox) })
	if cliWT.Branch != "nexus/e2e-cli" || cliWT.Worktree == wts[0].Worktree || cliWT.Worktree == wts[1].Worktree {
		t.Fatalf("CLI delegation: %+v", cliWT)
	}
	cli := len(wts)
	wts = append(wts, cliWT)
	for i, wt := range wts {
		brief := fmt.Sprintf("brief number %d", i)
		if i == cli {
			if out, errOut, code := stack.NexusIn(t, []byte(brief), append([]string{"delegate", "dispatch", wt.Sandbox, "--brief-file", "-", "--"}, agent...)...); code != 0 ||
				!strings.HasPrefix(out, "brief delivered to "+wt.Sandbox+": agent pid ") {
				t.Fatalf("nexus delegate dispatch: exit %d: %s%s", code, out, errOut)
			}
			continue
		}
		call(t, c, "delegate_agent_dispatch", map[string]any{"sandbox": wt.Sandbox, "brief": brief, "command": agent}, &map[string]any{})
	}
	for i, wt := range wts {
		want := fmt.Sprintf("agent: brief number %d", i)
		testutil.WaitFor(t, 2*time.Minute, func() error {
			var p pollResult
			if i == cli {
				if err := json.Unmarshal([]byte(stack.MustNexus(t, "delegate", "poll", wt.Sandbox, "--json")), &p); err != nil {
					return err
				}
			} else {
				call(t, c, "delegate_agent_poll", map[string]any{"sandbox": wt.Sandbox}, &p)
			}
			if p.Branch != wt.Branch || len(p.Log) == 0 || !strings.Contains(p.Log[0], want) {
				return fmt.Errorf("poll: %+v", p)
			}
			return nil
		})
		if log := git(t, repo, "log", "--oneline", wt.Branch); !strings.Contains(log, want) {
			t.Fatalf("host branch %s lacks the agent's commit:\n%s", wt.Branch, log)
		}
	}
	if log := git(t, repo, "log", "--oneline", "main"); strings.Contains(log, "agent:") {
		t.Fatalf("main got an agent commit:\n%s", log)
	}
	for i, wt := range wts {
		if i == cli {
			if out := stack.MustNexus(t, "delegate", "teardown", wt.Sandbox); !strings.HasPrefix(out, wt.Sandbox+" removed with its worktree "+wt.Worktree+"; branch "+wt.Branch+" kept at ") {
				t.Errorf("nexus delegate teardown: %q", out)
			}
		} else {
			call(t, c, "delegate_teardown", map[string]any{"sandbox": wt.Sandbox}, &map[string]any{})
		}
		if _, err := os.Stat(wt.Worktree); !os.IsNotExist(err) {
			t.Errorf("worktree %s left behind", wt.Worktree)
		}
		if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, wt.Sandbox) {
			t.Errorf("sandbox %s left behind:\n%s", wt.Sandbox, out)
		}
	}
}
