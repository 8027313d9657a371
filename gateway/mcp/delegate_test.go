package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// callFrom invokes a tool through c; safe to use from any goroutine.
func callFrom(c *client.Client, tool string, args map[string]any, out any) error {
	req := mcpgo.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.CallTool(ctx, req)
	if err != nil {
		return fmt.Errorf("%s: transport: %w", tool, err)
	}
	if res.IsError {
		return fmt.Errorf("%s: %s", tool, text(res))
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		return json.Unmarshal(b, out)
	}
	return nil
}

// TestDelegationsFromTwoServers: two MCP servers (two `nexus mcp` processes) drive delegations
// of one repository at the same time. The gateway owns the delegations, so a name is taken
// once, every create gets its own worktree and branch, and a poll racing a teardown never
// brings a torn-down delegation's record back.
func TestDelegationsFromTwoServers(t *testing.T) {
	st := newStack(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, second := connectMCP(t, ctx, st.bus)
	clients := []*client.Client{st.client, second}
	repo := newRepo(t)
	delegations := filepath.Join(string(st.bus.Home), "delegations")

	// The same names from both at once: each is created once.
	var mu sync.Mutex
	created := map[string]int{}
	var wg sync.WaitGroup
	for _, name := range []string{"same-a", "same-b", "same-c"} {
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var wt api.WorktreeResult
				if err := callFrom(c, "delegate_worktree_create", map[string]any{"repo_path": repo, "name": name, "image": "nexus-mini"}, &wt); err != nil {
					if !strings.Contains(err.Error(), "already exists") {
						t.Errorf("create %s: %v", name, err)
					}
					return
				}
				mu.Lock()
				created[name]++
				mu.Unlock()
			}()
		}
	}
	// Different names from both at once: all are created.
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("par-%d", i)
			if err := callFrom(clients[i%2], "delegate_worktree_create", map[string]any{"repo_path": repo, "name": name, "image": "nexus-mini"}, nil); err != nil {
				t.Errorf("create %s: %v", name, err)
				return
			}
			mu.Lock()
			created[name]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(created) != 9 {
		t.Fatalf("created %v, want 9 delegations", created)
	}
	for name, n := range created {
		if n != 1 {
			t.Errorf("%s created %d times", name, n)
		}
	}
	if n := strings.Count(git(t, repo, "worktree", "list"), "\n"); n != 10 {
		t.Errorf("git lists %d worktrees, want 10 (main and 9 delegations)", n)
	}

	// Each delegation's guest commits; one server polls while the other tears it down.
	tree := strings.TrimSpace(git(t, repo, "rev-parse", "HEAD^{tree}"))
	base := strings.TrimSpace(git(t, repo, "rev-parse", "HEAD"))
	commits := map[string]string{}
	for name := range created {
		commits[name] = strings.TrimSpace(gitEnv(t, repo, nil, "commit-tree", tree, "-p", base, "-m", "work of "+name))
		if err := os.WriteFile(filepath.Join(delegations, name, "refs", name), []byte(commits[name]+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name := range created {
		for i, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i == 0 {
					for range 3 {
						err := callFrom(c, "delegate_agent_poll", map[string]any{"sandbox": name}, nil)
						if err != nil && !strings.Contains(err.Error(), "no delegation") && !strings.Contains(err.Error(), "no sandbox named") {
							t.Errorf("poll %s: %v", name, err)
						}
					}
					return
				}
				var td api.TeardownResult
				if err := callFrom(c, "delegate_teardown", map[string]any{"sandbox": name, "force": true}, &td); err != nil {
					t.Errorf("teardown %s: %v", name, err)
				} else if td.Head != commits[name] {
					t.Errorf("teardown %s: head %s, want the guest's %s", name, td.Head, commits[name])
				}
			}()
		}
	}
	wg.Wait()
	ents, _ := os.ReadDir(delegations)
	for _, e := range ents {
		t.Errorf("left in %s after every teardown: %s", delegations, e.Name())
	}
	for name, commit := range commits {
		if got := strings.TrimSpace(git(t, repo, "rev-parse", "refs/heads/nexus/"+name)); got != commit {
			t.Errorf("branch nexus/%s at %s, want %s", name, got, commit)
		}
	}
	if n := strings.Count(git(t, repo, "worktree", "list"), "\n"); n != 1 {
		t.Errorf("git lists %d worktrees after teardown, want 1", n)
	}
	requireNoSandboxes(t, st)
}

// TestDelegationOfThePreviousBuild: a delegation whose record an earlier build kept in
// delegations/<name>/state.json keeps working: it is polled and torn down, and its record
// moves to delegations/<name>.json on the way.
func TestDelegationOfThePreviousBuild(t *testing.T) {
	st := newStack(t, true)
	repo := newRepo(t)
	var wt api.WorktreeResult
	st.ok(t, "delegate_worktree_create", map[string]any{"repo_path": repo, "name": "old", "image": "nexus-mini"}, &wt)
	delegations := filepath.Join(string(st.bus.Home), "delegations")
	record := filepath.Join(delegations, "old.json")
	legacy := filepath.Join(delegations, "old", "state.json")
	// Rewrite the record as the previous build wrote it.
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "sandbox", "repo", "common_dir", "git_dir", "worktree", "branch", "base", "synced", "created"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("the record lacks %q, which the previous build's state.json has: %s", k, b)
		}
	}
	if len(fields) != 10 {
		t.Errorf("the record has fields the previous build's state.json lacks: %s", b)
	}
	os.Remove(record)
	old, _ := json.MarshalIndent(fields, "", "  ")
	if err := os.WriteFile(legacy, old, 0o600); err != nil {
		t.Fatal(err)
	}

	tree := strings.TrimSpace(git(t, repo, "rev-parse", "HEAD^{tree}"))
	commit := strings.TrimSpace(gitEnv(t, repo, nil, "commit-tree", tree, "-p", wt.Base, "-m", "agent work"))
	os.WriteFile(filepath.Join(delegations, "old", "refs", "old"), []byte(commit+"\n"), 0o644)
	var poll api.PollResult
	st.ok(t, "delegate_agent_poll", map[string]any{"sandbox": "old"}, &poll)
	if poll.Branch != "nexus/old" || len(poll.Log) != 2 || !strings.HasSuffix(poll.Log[0], " agent work") {
		t.Errorf("poll: %+v", poll)
	}
	if _, err := os.Stat(legacy); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old state file is still there: %v", err)
	}
	var moved map[string]any
	if b, err := os.ReadFile(record); err != nil || json.Unmarshal(b, &moved) != nil || moved["synced"] != commit {
		t.Errorf("migrated record: %s (%v)", b, err)
	}
	var td api.TeardownResult
	st.ok(t, "delegate_teardown", map[string]any{"sandbox": "old"}, &td)
	if td.Head != commit {
		t.Errorf("teardown: %+v", td)
	}
	if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record after teardown: %v", err)
	}
}
