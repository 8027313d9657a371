package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

func TestToolsList(t *testing.T) {
	st := newStack(t, false)
	res, err := st.client.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	type schema struct {
		Properties map[string]map[string]any `json:"properties"`
		Required   []string                  `json:"required"`
	}
	got := map[string]schema{}
	for _, tool := range res.Tools {
		b, _ := json.Marshal(tool)
		var raw struct {
			InputSchema schema `json:"inputSchema"`
		}
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		got[tool.Name] = raw.InputSchema
	}
	want := map[string]struct{ required, optional []string }{
		"sandbox_create": {[]string{"name"}, []string{"project", "remove_on_exit", "start", "cold", "image", "memory", "vcpus", "agent", "egress", "allowed_hosts", "allow_private", "secrets", "labels", "repos", "config", "ttl", "idle_timeout",
			"disk", "disk_bps", "disk_iops", "max_conns", "conn_rate", "dns_rate", "egress_bandwidth", "ingress_bandwidth"}},
		"sandbox_list":             {nil, []string{"all", "selector"}},
		"sandbox_get":              {[]string{"name"}, nil},
		"sandbox_start":            {[]string{"name"}, nil},
		"sandbox_stop":             {[]string{"name"}, []string{"force"}},
		"sandbox_pause":            {[]string{"name"}, nil},
		"sandbox_resume":           {[]string{"name"}, nil},
		"sandbox_remove":           {[]string{"name"}, []string{"force"}},
		"sandbox_exec":             {[]string{"name", "argv"}, []string{"env", "workdir", "stdin", "timeout"}},
		"sandbox_run":              {[]string{"image", "argv"}, []string{"memory", "vcpus", "project", "name", "env", "stdin", "timeout"}},
		"sandbox_logs":             {[]string{"name"}, []string{"cursor", "max_bytes"}},
		"sandbox_ports":            {[]string{"name"}, nil},
		"egress_audit":             {[]string{"name"}, []string{"limit", "since", "denied"}},
		"delegate_worktree_create": {[]string{"repo_path"}, []string{"name", "base", "project", "image", "memory", "vcpus", "agent", "egress", "allowed_hosts"}},
		"delegate_agent_dispatch":  {[]string{"name", "brief"}, []string{"command"}},
		"delegate_agent_poll":      {[]string{"name"}, []string{"commits"}},
		"delegate_teardown":        {[]string{"name"}, []string{"force"}},
		"sandbox_snapshot":         {[]string{"name", "snapshot"}, nil},
		"sandbox_fork":             {[]string{"snapshot", "name"}, []string{"labels"}},
		"egress_allow":             {[]string{"name", "host"}, []string{"for"}},
		"egress_revoke":            {[]string{"name", "host"}, nil},
		"egress_requests":          {nil, nil},
		"egress_approve":           {[]string{"id"}, []string{"for", "ports"}},
	}
	if len(got) != len(want) {
		t.Errorf("got %d tools, want %d", len(got), len(want))
	}
	for name, w := range want {
		s, ok := got[name]
		if !ok {
			t.Errorf("tool %s missing", name)
			continue
		}
		req := slices.Clone(s.Required)
		slices.Sort(req)
		wreq := slices.Clone(w.required)
		slices.Sort(wreq)
		if !slices.Equal(req, wreq) {
			t.Errorf("%s: required %v, want %v", name, req, wreq)
		}
		for _, p := range append(slices.Clone(w.required), w.optional...) {
			if _, ok := s.Properties[p]; !ok {
				t.Errorf("%s: no property %s", name, p)
			}
		}
		if len(s.Properties) != len(w.required)+len(w.optional) {
			t.Errorf("%s: properties %v", name, keys(s.Properties))
		}
	}
	if _, ok := got["delegate_worktree_create"].Properties["allowed_branches"]; ok {
		t.Error("delegate_worktree_create must not offer allowed_branches")
	}
	if typ := got["sandbox_exec"].Properties["argv"]["type"]; typ != "array" {
		t.Errorf("sandbox_exec argv type %v", typ)
	}
}

func keys[M ~map[string]V, V any](m M) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestToolErrorsWithoutVMs(t *testing.T) {
	st := newStack(t, false)
	msg, _ := st.fails(t, "sandbox_create", map[string]any{"start": true, "name": "Bad Name!"})
	if !strings.Contains(msg, `invalid sandbox name "Bad Name!"`) {
		t.Errorf("bad name: %q", msg)
	}
	var list listResult
	st.ok(t, "sandbox_list", nil, &list)
	if list.Sandboxes == nil || len(list.Sandboxes) != 0 {
		t.Errorf("list: %+v", list)
	}
	res := st.call(t, "sandbox_list", map[string]any{})
	if !strings.Contains(text(res), `"sandboxes":[]`) {
		t.Errorf("list text fallback: %s", text(res))
	}
	msg, _ = st.fails(t, "sandbox_remove", map[string]any{"name": "ghost"})
	if !strings.Contains(msg, "default/ghost") {
		t.Errorf("remove unknown: %q", msg)
	}
	msg, _ = st.fails(t, "sandbox_exec", map[string]any{"name": "ghost", "argv": []string{"true"}})
	if !strings.Contains(msg, "default/ghost") {
		t.Errorf("exec unknown: %q", msg)
	}
	st.fails(t, "sandbox_exec", map[string]any{"name": "ghost", "argv": []string{}})
	st.fails(t, "sandbox_exec", map[string]any{"name": "ghost", "argv": "not a list"})
	msg, _ = st.fails(t, "sandbox_logs", map[string]any{"name": "ghost", "cursor": "-3"})
	if !strings.Contains(msg, "invalid cursor") {
		t.Errorf("bad cursor: %q", msg)
	}
	// A create that reaches the gateway but no vmm: the gateway's message, as a tool error.
	msg, _ = st.fails(t, "sandbox_create", map[string]any{"start": true, "name": "novm", "image": "nexus-mini"})
	if !strings.Contains(msg, "vmm") {
		t.Errorf("create without vmm: %q", msg)
	}
	// Without a portfwd service the tool error says which service is missing.
	msg, _ = st.fails(t, "sandbox_ports", map[string]any{"name": "novm"})
	if !strings.Contains(msg, "portfwd service is not running") {
		t.Errorf("ports: %q", msg)
	}
}

func TestWorktreeCreateRejectsAllowedBranches(t *testing.T) {
	st := newStack(t, false)
	repo := newRepo(t)
	msg, _ := st.fails(t, "delegate_worktree_create", map[string]any{"repo_path": repo, "allowed_branches": []string{"main"}})
	if !strings.Contains(msg, "allowed_branches is not accepted") {
		t.Errorf("allowed_branches: %q", msg)
	}
	for _, args := range []map[string]any{
		{"repo_path": "relative/path"},
		{"repo_path": t.TempDir()}, // not a repo
		{"repo_path": repo, "name": "Bad Name"},
		{"repo_path": repo, "base": "--upload-pack=evil"},
		{"repo_path": repo, "base": "no-such-branch"},
		{"repo_path": repo, "agent": "no-such-agent"},
	} {
		st.fails(t, "delegate_worktree_create", args)
	}
	if out := git(t, repo, "branch", "--list", "nexus/*"); out != "" {
		t.Errorf("branches left behind: %q", out)
	}
}

// Without a vmm the sandbox cannot boot: the tool error says so and the worktree and branch
// are rolled back.
func TestWorktreeCreateRollsBackWithoutVMM(t *testing.T) {
	st := newStack(t, false)
	repo := newRepo(t)
	msg, _ := st.fails(t, "delegate_worktree_create", map[string]any{"repo_path": repo, "name": "t1"})
	if !strings.Contains(msg, "vmm") {
		t.Errorf("message: %q", msg)
	}
	if _, err := os.Stat(filepath.Join(string(st.bus.Home), "worktrees", "t1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("worktree left behind: %v", err)
	}
	if out := git(t, repo, "branch", "--list", "nexus/*"); out != "" {
		t.Errorf("branch left behind: %q", out)
	}
	if out := git(t, repo, "worktree", "list"); strings.Count(out, "\n") != 1 {
		t.Errorf("worktrees: %q", out)
	}
}

func TestDelegationFlow(t *testing.T) {
	st := newStack(t, true)
	repo := newRepo(t)
	var wt api.WorktreeResult
	st.ok(t, "delegate_worktree_create", map[string]any{"repo_path": repo, "name": "t1", "image": "nexus-mini"}, &wt)
	if wt.Branch != "nexus/t1" || wt.Sandbox != "default/t1" || wt.Mount != wt.Worktree+":/workspace" {
		t.Fatalf("result: %+v", wt)
	}
	if wt.Worktree != filepath.Join(string(st.bus.Home), "worktrees", "t1") {
		t.Errorf("worktree at %s", wt.Worktree)
	}
	if wt.Record == nil || wt.Record.Labels[api.BranchLabel] != "nexus/t1" || len(wt.Record.Mounts) == 0 ||
		wt.Record.Mounts[0].Host != wt.Worktree || wt.Record.Mounts[0].Guest != "/workspace" {
		t.Errorf("record: %+v", wt.Record)
	}
	for _, m := range wt.Record.Mounts[1:] {
		if strings.HasPrefix(m.Host, wt.Worktree) {
			t.Errorf("a second mount of the worktree: %+v", m)
		}
	}
	if got := strings.TrimSpace(git(t, wt.Worktree, "rev-parse", "--abbrev-ref", "HEAD")); got != "nexus/t1" {
		t.Errorf("worktree branch %q", got)
	}
	// A second delegation gets its own worktree, branch and mounts (the object store is the
	// one thing delegations of one repository share).
	gitDir := strings.TrimSpace(git(t, repo, "rev-parse", "--absolute-git-dir"))
	var wt2 api.WorktreeResult
	st.ok(t, "delegate_worktree_create", map[string]any{"repo_path": repo, "name": "t2", "image": "nexus-mini"}, &wt2)
	for _, m := range wt2.Record.Mounts {
		for _, m1 := range wt.Record.Mounts {
			if m.Host == m1.Host && m.Host != filepath.Join(gitDir, "objects") {
				t.Errorf("mount shared between delegations: %s", m.Host)
			}
		}
	}
	st.fails(t, "delegate_worktree_create", map[string]any{"repo_path": repo, "name": "t1"}) // taken

	// Dirty worktree: teardown without force lists the changed files.
	os.WriteFile(filepath.Join(wt.Worktree, "README"), []byte("changed\n"), 0o644)
	os.WriteFile(filepath.Join(wt.Worktree, "new.txt"), []byte("new\n"), 0o644)
	var poll api.PollResult
	st.ok(t, "delegate_agent_poll", map[string]any{"sandbox": "t1"}, &poll)
	if poll.Branch != "nexus/t1" || !poll.Dirty || len(poll.Status) != 2 || len(poll.Log) != 1 || !strings.HasSuffix(poll.Log[0], " initial") {
		t.Errorf("poll: %+v", poll)
	}
	msg, res := st.fails(t, "delegate_teardown", map[string]any{"sandbox": "t1"})
	if !strings.Contains(msg, "README") || !strings.Contains(msg, "new.txt") || !strings.Contains(msg, "force") {
		t.Errorf("dirty teardown: %q", msg)
	}
	var details struct {
		ChangedFiles []string `json:"changed_files"`
	}
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &details)
	if !slices.Equal(details.ChangedFiles, []string{"README", "new.txt"}) {
		t.Errorf("changed_files: %s", b)
	}
	if _, err := os.Stat(wt.Worktree); err != nil {
		t.Errorf("dirty teardown removed the worktree: %v", err)
	}

	// The guest commits: its git writes objects into the repository and moves its own branch
	// ref (emulated here with commit-tree and the guest's ref file).
	tree := strings.TrimSpace(git(t, repo, "rev-parse", "HEAD^{tree}"))
	commit := strings.TrimSpace(gitEnv(t, repo, nil, "commit-tree", tree, "-p", wt.Base, "-m", "agent work"))
	os.WriteFile(filepath.Join(string(st.bus.Home), "delegations", "t1", "refs", "t1"), []byte(commit+"\n"), 0o644)
	st.ok(t, "delegate_agent_poll", map[string]any{"sandbox": "default/t1"}, &poll)
	if len(poll.Log) != 2 || !strings.HasSuffix(poll.Log[0], " agent work") {
		t.Errorf("poll after commit: %+v", poll)
	}
	if got := strings.TrimSpace(git(t, repo, "rev-parse", "refs/heads/nexus/t1")); got != commit {
		t.Errorf("branch at %s, want %s", got, commit)
	}
	// A guest ref naming no commit is never copied.
	os.WriteFile(filepath.Join(string(st.bus.Home), "delegations", "t1", "refs", "t1"), []byte(strings.Repeat("ab", 20)+"\n"), 0o644)
	st.ok(t, "delegate_agent_poll", map[string]any{"sandbox": "t1"}, &poll)
	if got := strings.TrimSpace(git(t, repo, "rev-parse", "refs/heads/nexus/t1")); got != commit {
		t.Errorf("branch moved to a bogus ref: %s", got)
	}

	// Dispatch: the fake vmm plays the guest, with /workspace and /run/nexus on the host.
	run := t.TempDir()
	st.vmm.paths = map[string]string{"/run/nexus": run, "/workspace": wt.Worktree}
	msg, _ = st.fails(t, "delegate_agent_dispatch", map[string]any{"sandbox": "t1", "brief": "do it", "command": []string{"relative"}})
	if !strings.Contains(msg, "absolute") {
		t.Errorf("relative command: %q", msg)
	}
	var disp api.DispatchResult
	st.ok(t, "delegate_agent_dispatch", map[string]any{"sandbox": "t1", "brief": "fix the flaky test\n",
		"command": []string{"/bin/sh", "-c", "cat > agent-got-brief.txt"}}, &disp)
	if disp.PID <= 0 || disp.BriefPath != api.BriefPath {
		t.Errorf("dispatch: %+v", disp)
	}
	if b, _ := os.ReadFile(filepath.Join(run, "brief.md")); string(b) != "fix the flaky test\n" {
		t.Errorf("brief in the guest: %q", b)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(wt.Worktree, "agent-got-brief.txt"))
		if err != nil || string(b) != "fix the flaky test\n" {
			return errors.New("the agent has not written its file")
		}
		return nil
	})

	// Forced teardown removes the sandbox and the worktree, and keeps the branch.
	var td api.TeardownResult
	st.ok(t, "delegate_teardown", map[string]any{"sandbox": "t1", "force": true}, &td)
	if td.Head != commit || len(td.Discarded) != 3 {
		t.Errorf("teardown: %+v", td)
	}
	if _, err := os.Stat(wt.Worktree); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("worktree still there: %v", err)
	}
	if _, err := st.gw.Get(context.Background(), "t1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("sandbox still there: %v", err)
	}
	if got := strings.TrimSpace(git(t, repo, "rev-parse", "refs/heads/nexus/t1")); got != commit {
		t.Errorf("branch after teardown: %s", got)
	}
	if strings.Contains(git(t, repo, "worktree", "list"), "t1") {
		t.Error("git still lists the worktree")
	}
	st.fails(t, "delegate_agent_poll", map[string]any{"sandbox": "t1"})

	// A clean worktree tears down without force.
	st.ok(t, "delegate_teardown", map[string]any{"sandbox": "t2"}, &td)
}

func TestExecOutputLimits(t *testing.T) {
	st := newStack(t, true)
	st.ok(t, "sandbox_create", map[string]any{"start": true, "name": "box", "image": "nexus-mini", "labels": map[string]string{"task": "42"}}, nil)
	var r ExecResult
	// Over 64 KiB a stream keeps its first and last 32 KiB: a failing build's error is at the end.
	st.ok(t, "sandbox_exec", map[string]any{"name": "box", "argv": []string{"sh", "-c",
		"printf START; head -c 102390 /dev/zero | tr '\\0' a; printf 'error: at the end'; head -c 70000 /dev/zero | tr '\\0' b >&2; exit 7"}}, &r)
	omitted := fmt.Sprintf("\n[nexus: %d bytes omitted]\n", 102412-OutputLimit)
	if r.ExitCode != 7 || r.StdoutBytes != 102412 || !r.StdoutTruncated || r.StdoutOmitted != 102412-OutputLimit ||
		len(r.Stdout) != OutputLimit+len(omitted) || !strings.HasPrefix(r.Stdout, "START") || !strings.HasSuffix(r.Stdout, "error: at the end") ||
		!strings.Contains(r.Stdout, omitted) ||
		r.StderrBytes != 70000 || r.StderrOmitted != 70000-OutputLimit || !r.StderrTruncated || strings.Trim(r.Stderr, "b") == "" {
		t.Errorf("exec: code %d stdout %d/%d %v omitted %d stderr %d/%d %v omitted %d", r.ExitCode, len(r.Stdout), r.StdoutBytes, r.StdoutTruncated, r.StdoutOmitted,
			len(r.Stderr), r.StderrBytes, r.StderrTruncated, r.StderrOmitted)
	}
	st.ok(t, "sandbox_exec", map[string]any{"name": "box", "argv": []string{"cat"}, "stdin": "piped"}, &r)
	if r.Stdout != "piped" || r.StdoutTruncated || r.StdoutBytes != 5 {
		t.Errorf("stdin: %+v", r)
	}
	st.ok(t, "sandbox_exec", map[string]any{"name": "box", "argv": []string{"sleep", "30"}, "timeout": "500ms"}, &r)
	if r.ExitCode != 124 {
		t.Errorf("timeout: %+v", r)
	}
	st.fails(t, "sandbox_exec", map[string]any{"name": "box", "argv": []string{"true"}, "timeout": "forever"})
	st.fails(t, "sandbox_exec", map[string]any{"name": "box", "argv": []string{"true"}, "env": []string{"NOEQUALS"}})
	var list listResult
	st.ok(t, "sandbox_list", map[string]any{"selector": "task=42"}, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != "default/box" {
		t.Errorf("list by label: %+v", list)
	}
	// Lifecycle verbs.
	var ar applyResult
	for _, step := range []struct{ tool, state string }{
		{"sandbox_pause", "paused"}, {"sandbox_resume", "running"}, {"sandbox_stop", "stopped"}, {"sandbox_start", "running"}, {"sandbox_remove", "removed"},
	} {
		st.ok(t, step.tool, map[string]any{"name": "box"}, &ar)
		if ar.State != step.state || ar.Name != "default/box" {
			t.Errorf("%s: %+v", step.tool, ar)
		}
	}
}

func TestCaptureKeepsWholeRunes(t *testing.T) {
	c := &capture{limit: 8}
	c.Write([]byte("abcdefg"))
	c.Write([]byte("é!")) // 10 bytes: head "abcd", tail "gé!"
	if c.text() != "abcd\n[nexus: 2 bytes omitted]\ngé!" || !c.truncated() || c.total != 10 || c.omitted() != 2 {
		t.Errorf("text %q total %d omitted %d", c.text(), c.total, c.omitted())
	}
	c = &capture{limit: 8}
	c.Write([]byte("abcdef"))
	c.Write([]byte("é"))
	if c.text() != "abcdefé" || c.truncated() || c.omitted() != 0 {
		t.Errorf("exact fit: %q", c.text())
	}
	// The head and the tail each cut an é: neither keeps half of it.
	c = &capture{limit: 8}
	for _, p := range []string{"abcé", "xxxx", "éfgh"} {
		c.Write([]byte(p))
	}
	if c.text() != "abc\n[nexus: 8 bytes omitted]\nfgh" || c.omitted() != 8 {
		t.Errorf("cut runes: %q omitted %d", c.text(), c.omitted())
	}
	// Byte by byte, the tail ring keeps the last bytes in order.
	c = &capture{limit: 6}
	for _, b := range []byte("0123456789") {
		c.Write([]byte{b})
	}
	if c.text() != "012\n[nexus: 4 bytes omitted]\n789" {
		t.Errorf("ring: %q", c.text())
	}
}

func TestSandboxRun(t *testing.T) {
	st := newStack(t, true)
	var r ExecResult
	st.ok(t, "sandbox_run", map[string]any{"image": "nexus-mini", "argv": []string{"sh", "-c", "echo hi; echo err >&2; exit 3"}}, &r)
	if r.ExitCode != 3 || r.Stdout != "hi\n" || r.Stderr != "err\n" || r.StdoutBytes != 3 || r.StderrBytes != 4 || !strings.HasPrefix(r.Sandbox, "default/run-") {
		t.Errorf("run: %+v", r)
	}
	requireNoSandboxes(t, st)

	// Removed on error: the exec is refused.
	st.vmm.execHook = func(vmmapi.ExecRequest) error { return errdefs.Invalid("exec refused by the test") }
	msg, _ := st.fails(t, "sandbox_run", map[string]any{"image": "nexus-mini", "argv": []string{"true"}, "project": "p", "name": "fails"})
	if !strings.Contains(msg, "exec refused by the test") {
		t.Errorf("run error: %q", msg)
	}
	requireNoSandboxes(t, st)
	st.vmm.execHook = nil

	// Removed on timeout.
	st.ok(t, "sandbox_run", map[string]any{"image": "nexus-mini", "argv": []string{"sleep", "30"}, "timeout": "300ms"}, &r)
	if r.ExitCode != 124 {
		t.Errorf("run timeout: %+v", r)
	}
	requireNoSandboxes(t, st)

	// Removed when the caller gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "sandbox_run"
	req.Params.Arguments = map[string]any{"image": "nexus-mini", "argv": []string{"sleep", "30"}}
	st.client.CallTool(ctx, req)
	cancel()
	testutil.WaitFor(t, 20*time.Second, func() error {
		list, err := st.gw.List(context.Background(), api.ListRequest{All: true})
		if err != nil || len(list) != 0 || st.vmm.running() != 0 {
			return errors.New("the cancelled run's sandbox is still there")
		}
		return nil
	})

	// Never removes a sandbox it did not make.
	st.ok(t, "sandbox_create", map[string]any{"start": true, "name": "keep", "image": "nexus-mini"}, nil)
	msg, _ = st.fails(t, "sandbox_run", map[string]any{"image": "nexus-mini", "argv": []string{"true"}, "name": "keep"})
	if !strings.Contains(msg, "keep") {
		t.Errorf("run over an existing name: %q", msg)
	}
	if _, err := st.gw.Get(context.Background(), "keep"); err != nil {
		t.Errorf("sandbox_run removed a sandbox it did not create: %v", err)
	}
}

func requireNoSandboxes(t *testing.T, st *stack) {
	t.Helper()
	var list listResult
	st.ok(t, "sandbox_list", nil, &list)
	if len(list.Sandboxes) != 0 || st.vmm.running() != 0 {
		t.Fatalf("sandboxes left: %+v (vms %d)", list.Sandboxes, st.vmm.running())
	}
}

func TestRemoveOnExit(t *testing.T) {
	st := newStack(t, true)
	st.ok(t, "sandbox_create", map[string]any{"start": true, "name": "tmp", "project": "p", "remove_on_exit": true, "image": "nexus-mini"}, nil)
	st.ok(t, "sandbox_create", map[string]any{"start": true, "name": "stays", "image": "nexus-mini"}, nil)
	st.srv.Close()
	if _, err := st.gw.Get(context.Background(), "p/tmp"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("remove_on_exit sandbox: %v", err)
	}
	if _, err := st.gw.Get(context.Background(), "stays"); err != nil {
		t.Errorf("other sandbox: %v", err)
	}
}

func TestSandboxLogsCursor(t *testing.T) {
	st := newStack(t, true)
	st.ok(t, "sandbox_create", map[string]any{"start": true, "name": "box", "image": "nexus-mini"}, nil)
	full := "boot: ok\nagent: ready ✓\n"
	var r LogsResult
	st.ok(t, "sandbox_logs", map[string]any{"name": "box", "max_bytes": len(full) - 2}, &r)
	if r.Data != "boot: ok\nagent: ready " || r.NextCursor != "22" {
		t.Errorf("first chunk: %+v", r)
	}
	st.ok(t, "sandbox_logs", map[string]any{"name": "box", "cursor": r.NextCursor}, &r)
	if r.Data != "✓\n" {
		t.Errorf("second chunk: %+v", r)
	}
	next := r.NextCursor
	st.ok(t, "sandbox_logs", map[string]any{"name": "box", "cursor": next}, &r)
	if r.Data != "" || r.NextCursor != next {
		t.Errorf("caught up: %+v", r)
	}
}

func TestEgressAudit(t *testing.T) {
	st := newStack(t, true)
	var sb api.Sandbox
	st.ok(t, "sandbox_create", map[string]any{"start": true, "name": "box", "image": "nexus-mini"}, &sb)
	var r AuditResult
	st.ok(t, "egress_audit", map[string]any{"sandbox": "box"}, &r)
	if r.Events == nil || len(r.Events) != 0 {
		t.Errorf("no events: %+v", r)
	}
	js, err := jetstream.New(st.bus.Connect(t, bus.UserAdmin))
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range []audit.Event{
		{Host: "a.example", Decision: audit.Allow}, {Host: "b.example", Decision: audit.Deny},
		{Host: "c.example", Decision: audit.Allow}, {Host: "d.example", Decision: audit.Deny},
	} {
		ev.Time, ev.Sandbox, ev.Layer, ev.Port = time.Now(), sb.ID, audit.LayerTLS, 443+i
		b, _ := json.Marshal(ev)
		// The first two as an older build wrote them (nexus.audit.egress.<id>).
		svc := bus.UserMITM
		if i < 2 {
			svc = audit.LegacyService
		}
		if _, err := js.Publish(context.Background(), audit.Subject(svc, sb.ID), b); err != nil {
			t.Fatal(err)
		}
	}
	js.Publish(context.Background(), audit.Subject(bus.UserMITM, "someone-else"), []byte(`{"host":"x","decision":"deny"}`))
	st.ok(t, "egress_audit", map[string]any{"sandbox": "box", "limit": 3}, &r)
	if hosts(r.Events) != "b.example c.example d.example" {
		t.Errorf("last 3: %s", hosts(r.Events))
	}
	st.ok(t, "egress_audit", map[string]any{"sandbox": "box", "denied": true}, &r)
	if hosts(r.Events) != "b.example d.example" {
		t.Errorf("denied: %s", hosts(r.Events))
	}
	st.ok(t, "egress_audit", map[string]any{"sandbox": "box", "since": "1h"}, &r)
	if len(r.Events) != 4 {
		t.Errorf("since: %s", hosts(r.Events))
	}
	st.fails(t, "egress_audit", map[string]any{"sandbox": "ghost"})
}

func hosts(evs []audit.Event) string {
	var h []string
	for _, e := range evs {
		h = append(h, e.Host)
	}
	return strings.Join(h, " ")
}

// newRepo makes a git repository with one commit.
func newRepo(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "repo")
	os.MkdirAll(dir, 0o755)
	git(t, dir, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(dir, "README"), []byte("hello\n"), 0o644)
	git(t, dir, "add", "README")
	git(t, dir, "commit", "-q", "-m", "initial")
	return dir
}

func git(t *testing.T, dir string, args ...string) string { return gitEnv(t, dir, nil, args...) }

func gitEnv(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return string(out)
}

// TestCreateWithConfigAndRepos: sandbox_create applies a project config file and binds repos
// like `nexus create --config --repo`; a broken config is refused with its file:line.
func TestCreateWithConfigAndRepos(t *testing.T) {
	st := newStack(t, true)
	dir := t.TempDir()
	good := filepath.Join(dir, "config.yaml")
	os.WriteFile(good, []byte("version: 1\negress:\n  allow:\n    - registry.npmjs.org\n"), 0o644)
	var sb api.Sandbox
	st.ok(t, "sandbox_create", map[string]any{"start": true, "name": "cfg", "image": "nexus-mini", "config": good, "repos": []string{"acme/app"}}, &sb)
	if sb.Config == nil || sb.Config.Source != good || !slices.Contains(sb.Config.Egress.Allow, "registry.npmjs.org") {
		t.Errorf("config not applied: %+v", sb.Config)
	}
	if !slices.Equal(sb.Egress.Repos, []string{"acme/app"}) || sb.Egress.Mode != api.EgressCurated {
		t.Errorf("egress: %+v", sb.Egress)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\negress:\n  allow: nope\n"), 0o644)
	msg, _ := st.fails(t, "sandbox_create", map[string]any{"start": true, "name": "bad", "image": "nexus-mini", "config": bad})
	if !strings.Contains(msg, bad+":3") {
		t.Errorf("bad config: %q", msg)
	}
	msg, _ = st.fails(t, "sandbox_create", map[string]any{"start": true, "name": "missing", "image": "nexus-mini", "config": filepath.Join(dir, "none.yaml")})
	if !strings.Contains(msg, "none.yaml") {
		t.Errorf("missing config: %q", msg)
	}
}
