package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

// Worktree delegation (issue 9, seed "worktree-native parallel flow"): each task gets a git
// worktree of a host repo on its own branch nexus/<name>, mounted at /workspace of its own
// sandbox; the in-guest agent commits there; teardown removes the sandbox and the worktree and
// keeps the branch.
//
// The worktree's .git file names its git dir by host path. The guest sees, at that same path:
//   - the worktree's own git dir (HEAD, index), read-write;
//   - in place of the repository's .git, a read-only view nexus writes (a minimal config: no
//     hooks, no remotes, no credentials of the host repo), with read-write mounts of the
//     repository's objects and of a per-delegation refs/heads/nexus directory holding only this
//     delegation's branch.
//
// The host copies the guest's branch ref into the repository (after checking that it names a
// commit) when it polls and at teardown. Host git never reads configuration from a
// guest-writable place (see git.go).

const (
	// delegateLabel marks a delegation's sandbox with the delegation's name.
	delegateLabel = "nexus.delegate"
	// branchLabel records the worktree's branch: the branch policy of the sandbox.
	branchLabel = "nexus.branch"
	// briefPath is where dispatch writes the brief in the guest (outside the worktree so it does
	// not show in git status).
	briefPath = "/run/nexus/brief.md"
	agentLog  = "/run/nexus/agent.log"
	agentPID  = "/run/nexus/agent.pid"
	workspace = "/workspace"
	// MaxBrief bounds a brief.
	MaxBrief = 1 << 20
)

var delegNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// delegation is the host's record of one delegation, in $NEXUS_HOME/delegations/<name>/state.json.
type delegation struct {
	Name      string `json:"name"`
	Sandbox   string `json:"sandbox"`
	Repo      string `json:"repo"`
	CommonDir string `json:"common_dir"`
	GitDir    string `json:"git_dir"` // the worktree's own git dir, under CommonDir/worktrees
	Worktree  string `json:"worktree"`
	Branch    string `json:"branch"`
	Base      string `json:"base"` // the commit the branch started at
	// Synced is the guest's branch ref as last copied into the repository.
	Synced  string    `json:"synced"`
	Created time.Time `json:"created"`
	dir     string
}

func (s *Server) delegationsDir() string { return filepath.Join(string(s.cfg.Home), "delegations") }
func (s *Server) worktreesDir() string   { return filepath.Join(string(s.cfg.Home), "worktrees") }

func (d *delegation) guestView() string { return filepath.Join(d.dir, "guestgit") }
func (d *delegation) hostView() string  { return filepath.Join(d.dir, "hostgit") }
func (d *delegation) refsDir() string   { return filepath.Join(d.dir, "refs") }
func (d *delegation) logsDir() string   { return filepath.Join(d.dir, "logs") }
func (d *delegation) ref() string       { return "refs/heads/" + d.Branch }
func (d *delegation) short() string     { return strings.TrimPrefix(d.Branch, "nexus/") }

func (s *Server) loadDelegation(name string) (*delegation, error) {
	dir := filepath.Join(s.delegationsDir(), name)
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.NotFound("no delegation %q: create one with delegate_worktree_create", name)
	}
	if err != nil {
		return nil, err
	}
	var d delegation
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("delegation %s: damaged state file: %w", name, err)
	}
	d.dir = dir
	return &d, nil
}

func (d *delegation) save() error {
	b, _ := json.MarshalIndent(d, "", "  ")
	tmp := filepath.Join(d.dir, ".state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(d.dir, "state.json"))
}

// lookup finds the delegation of a sandbox: by its label, or (the sandbox already gone) by
// the name part of the sandbox name.
func (s *Server) lookup(ctx context.Context, c *api.Client, sandbox string) (*delegation, *api.Sandbox, error) {
	full, err := api.ParseName(sandbox)
	if err != nil {
		return nil, nil, err
	}
	sb, err := c.Get(ctx, full)
	switch {
	case err == nil:
		name := sb.Labels[delegateLabel]
		if name == "" {
			return nil, nil, errdefs.Invalid("sandbox %s is not a delegation: create one with delegate_worktree_create", sb.Name)
		}
		d, err := s.loadDelegation(name)
		return d, sb, err
	case errors.Is(err, errdefs.ErrNotFound):
		_, name, _ := strings.Cut(full, "/")
		d, derr := s.loadDelegation(name)
		if derr != nil || d.Sandbox != full {
			return nil, nil, err
		}
		return d, nil, nil
	}
	return nil, nil, err
}

type worktreeArgs struct {
	RepoPath     string   `json:"repo_path"`
	Name         string   `json:"name"`
	Base         string   `json:"base"`
	Project      string   `json:"project"`
	Image        string   `json:"image"`
	Memory       int      `json:"memory"`
	VCPUs        int      `json:"vcpus"`
	Agent        string   `json:"agent"`
	Egress       string   `json:"egress"`
	AllowedHosts []string `json:"allowed_hosts"`
}

// WorktreeResult describes a new delegation.
type WorktreeResult struct {
	Sandbox  string       `json:"sandbox"`
	Branch   string       `json:"branch"`
	Worktree string       `json:"worktree"`
	Base     string       `json:"base"`
	Mount    string       `json:"mount"`
	Record   *api.Sandbox `json:"record"`
}

func (s *Server) delegateWorktreeCreate(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	if _, ok := req.GetArguments()["allowed_branches"]; ok {
		return nil, errdefs.Invalid("allowed_branches is not accepted: the branch policy is derived from the worktree's branch (nexus/<name>)")
	}
	var a worktreeArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.RepoPath == "" {
		return nil, errdefs.Invalid("repo_path is required")
	}
	if a.Name == "" {
		a.Name = "task-" + randomHex(3)
	}
	if !delegNameRE.MatchString(a.Name) {
		return nil, errdefs.Invalid("invalid name %q: 1-63 of a-z 0-9 - _ starting with a letter or digit", a.Name)
	}
	if a.Base == "" {
		a.Base = "HEAD"
	}
	if strings.HasPrefix(a.Base, "-") || strings.ContainsAny(a.Base, " \n\t") {
		return nil, errdefs.Invalid("invalid base %q: name a commit, branch or tag", a.Base)
	}
	if a.Agent != "" {
		if _, err := profile.Get(a.Agent); err != nil {
			return nil, err
		}
	}
	sandbox, err := fullName(a.Project, a.Name)
	if err != nil {
		return nil, err
	}
	repo, err := inspectRepo(ctx, a.RepoPath)
	if err != nil {
		return nil, err
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := c.Get(ctx, sandbox); err == nil {
		return nil, errdefs.Conflict("sandbox %s already exists", sandbox)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}

	s.delegMu.Lock()
	defer s.delegMu.Unlock()
	d := &delegation{Name: a.Name, Sandbox: sandbox, Repo: repo.Top, CommonDir: repo.CommonDir, Branch: "nexus/" + a.Name,
		Worktree: filepath.Join(s.worktreesDir(), a.Name), Created: time.Now().UTC(), dir: filepath.Join(s.delegationsDir(), a.Name)}
	if strings.ContainsAny(d.Worktree+d.dir, ":\n") {
		return nil, errdefs.Invalid("NEXUS_HOME %s contains ':', which cannot be mounted into a sandbox", s.cfg.Home)
	}
	if err := os.MkdirAll(s.delegationsDir(), 0o700); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.worktreesDir(), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(d.dir, 0o700); errors.Is(err, os.ErrExist) {
		return nil, errdefs.Conflict("delegation %s already exists: tear it down with delegate_teardown first", a.Name)
	} else if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.rollback(d)
		}
	}()
	base, err := runGit(ctx, nil, "-C", repo.Top, "rev-parse", "--verify", "--end-of-options", a.Base+"^{commit}")
	if err != nil {
		return nil, errdefs.Invalid("base %q is not a commit of %s", a.Base, repo.Top)
	}
	d.Base = strings.TrimSpace(base)
	d.Synced = d.Base
	if _, err := runGit(ctx, nil, "-C", repo.Top, "rev-parse", "--verify", "--quiet", d.ref()); err == nil {
		return nil, errdefs.Conflict("branch %s already exists in %s", d.Branch, repo.Top)
	}
	if _, err := runGit(ctx, nil, "-C", repo.Top, "worktree", "add", "-b", d.Branch, d.Worktree, d.Base); err != nil {
		return nil, errdefs.Conflict("create the worktree: %v", err)
	}
	gitdir, err := readSmall(filepath.Join(d.Worktree, ".git"), 4096)
	if err != nil || !strings.HasPrefix(gitdir, "gitdir: ") {
		return nil, fmt.Errorf("create the worktree: unexpected %s/.git", d.Worktree)
	}
	d.GitDir = filepath.Clean(strings.TrimPrefix(gitdir, "gitdir: "))
	if err := d.prepareViews(ctx); err != nil {
		return nil, fmt.Errorf("prepare the guest's git view: %w", err)
	}
	if err := d.save(); err != nil {
		return nil, err
	}
	cr := api.CreateRequest{Name: sandbox, Image: a.Image, MemoryMiB: a.Memory, VCPUs: a.VCPUs, Agent: a.Agent,
		EgressMode: a.Egress, AllowHosts: a.AllowedHosts,
		Labels: map[string]string{delegateLabel: d.Name, branchLabel: d.Branch},
		Mounts: d.mounts()}
	if cr.Image == "" {
		cr.Image = "nexus-base"
	}
	cctx, cancel := context.WithTimeout(ctx, api.CreateTimeout)
	sb, err := c.Create(cctx, cr)
	cancel()
	if err != nil {
		return nil, err
	}
	ok = true
	return WorktreeResult{Sandbox: sb.Name, Branch: d.Branch, Worktree: d.Worktree, Base: d.Base, Mount: d.Worktree + ":/workspace", Record: sb}, nil
}

// mounts lists the sandbox's mounts, outermost first (the vmm mounts them in order).
func (d *delegation) mounts() []string {
	return []string{
		d.Worktree + ":" + workspace,
		d.guestView() + ":" + d.CommonDir + ":ro",
		filepath.Join(d.CommonDir, "objects") + ":" + filepath.Join(d.CommonDir, "objects"),
		d.refsDir() + ":" + filepath.Join(d.CommonDir, "refs", "heads", "nexus"),
		d.logsDir() + ":" + filepath.Join(d.CommonDir, "logs", "refs", "heads", "nexus"),
		d.GitDir + ":" + d.GitDir,
	}
}

// prepareViews writes the guest's read-only view of the repository's git dir, the guest's
// private branch ref and reflog directories, and the host's view used to inspect the worktree.
func (d *delegation) prepareViews(ctx context.Context) error {
	gv := d.guestView()
	rel, err := filepath.Rel(d.CommonDir, d.GitDir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("worktree git dir %s is not under %s", d.GitDir, d.CommonDir)
	}
	for _, p := range []string{filepath.Join(gv, "objects"), filepath.Join(gv, "refs", "heads", "nexus"), filepath.Join(gv, "refs", "tags"),
		filepath.Join(gv, "logs", "refs", "heads", "nexus"), filepath.Join(gv, rel), d.refsDir(), d.logsDir(), d.hostView()} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	version, _ := runGit(ctx, nil, "--git-dir="+d.CommonDir, "config", "--get", "core.repositoryformatversion")
	format, _ := runGit(ctx, nil, "--git-dir="+d.CommonDir, "config", "--get", "extensions.objectformat")
	cfg := "[core]\n\trepositoryformatversion = " + orDefault(strings.TrimSpace(version), "0") +
		"\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"
	if f := strings.TrimSpace(format); f != "" {
		cfg += "[extensions]\n\tobjectformat = " + f + "\n"
	}
	files := map[string]string{
		filepath.Join(gv, "config"):              cfg,
		filepath.Join(gv, "HEAD"):                "ref: " + d.ref() + "\n",
		filepath.Join(d.refsDir(), d.short()):    d.Base + "\n",
		filepath.Join(d.hostView(), "HEAD"):      "ref: " + d.ref() + "\n",
		filepath.Join(d.hostView(), "commondir"): d.CommonDir + "\n",
	}
	for p, content := range files {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// rollback undoes a delegation that could not be created.
func (s *Server) rollback(d *delegation) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.removeOwned(d.Sandbox, delegateLabel, d.Name); err != nil {
		s.log.Warn().Err(err).Str("sandbox", d.Sandbox).Msg("delegation rollback: sandbox not removed")
	}
	if _, err := os.Stat(d.Worktree); err == nil {
		runGit(ctx, nil, "-C", d.Repo, "worktree", "remove", "--force", d.Worktree)
		os.RemoveAll(d.Worktree)
		runGit(ctx, nil, "-C", d.Repo, "worktree", "prune")
		runGit(ctx, nil, "-C", d.Repo, "branch", "-D", "--end-of-options", d.Branch)
	}
	os.RemoveAll(d.dir)
}

// syncBranch copies the guest's branch ref into the repository when the guest moved it and it
// names a commit the repository has; the branch never moves to anything else, and commits made
// on the host are kept until the guest moves its branch again.
func (d *delegation) syncBranch(ctx context.Context) error {
	sha, err := readSmall(filepath.Join(d.refsDir(), d.short()), 128)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // the guest deleted its branch: keep the host's
		}
		return err
	}
	if sha == d.Synced {
		return nil
	}
	if !hexRE.MatchString(sha) {
		return errNoCommit
	}
	if _, err := runGit(ctx, nil, "--git-dir="+d.CommonDir, "cat-file", "-e", sha+"^{commit}"); err != nil {
		return errNoCommit
	}
	if _, err = runGit(ctx, nil, "--git-dir="+d.CommonDir, "update-ref", "-m", "nexus: delegation "+d.Name, d.ref(), sha); err != nil {
		return err
	}
	d.Synced = sha
	return d.save()
}

// status is git status --porcelain of the worktree against the branch, read with the host's
// configuration only.
func (d *delegation) status(ctx context.Context) ([]string, error) {
	env := []string{"GIT_DIR=" + d.hostView(), "GIT_WORK_TREE=" + d.Worktree}
	index := filepath.Join(d.GitDir, "index")
	if fi, err := os.Lstat(index); err == nil {
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("the worktree's index is not a regular file")
		}
		env = append(env, "GIT_INDEX_FILE="+index)
	} else {
		env = append(env, "GIT_INDEX_FILE="+filepath.Join(d.dir, "empty-index"))
	}
	args := append(append([]string{}, safeGitConfig...), "status", "--porcelain", "--ignore-submodules=all")
	out, err := runGit(ctx, env, args...)
	if err != nil {
		return nil, err
	}
	lines := []string{}
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// log is the branch's recent commits, one "sha subject" line each.
func (d *delegation) log(ctx context.Context, n int) ([]string, error) {
	out, err := runGit(ctx, nil, append(append([]string{"--git-dir=" + d.CommonDir}, safeGitConfig...),
		"log", "--format=%h %s", "-n", strconv.Itoa(n), d.ref(), "--")...)
	if err != nil {
		return nil, err
	}
	lines := []string{}
	for _, l := range strings.Split(out, "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// head is what the worktree has checked out: a branch name, or a commit when detached.
func (d *delegation) head() string {
	h, err := readSmall(filepath.Join(d.GitDir, "HEAD"), 512)
	if err != nil {
		return ""
	}
	if ref, ok := strings.CutPrefix(h, "ref: refs/heads/"); ok {
		return ref
	}
	if hexRE.MatchString(h) {
		return h
	}
	return ""
}

type dispatchArgs struct {
	Sandbox string   `json:"sandbox"`
	Brief   string   `json:"brief"`
	Command []string `json:"command"`
}

// DispatchResult says the brief was delivered and the agent started.
type DispatchResult struct {
	Sandbox   string   `json:"sandbox"`
	BriefPath string   `json:"brief_path"`
	Command   []string `json:"command"`
	PID       int      `json:"pid"`
	Log       string   `json:"log"`
}

// launchScript starts the agent detached in the worktree, fed the brief on stdin, in its own
// session so that it outlives this exec (whose end kills what is left of its process group).
// It returns once the agent has written its pid, i.e. once it has left the group.
const launchScript = `set -e
mkdir -p "$(dirname "$BRIEF")"
cat > "$BRIEF"
cd "$WORKSPACE"
rm -f "$PIDFILE"
setsid /bin/sh -c 'echo $$ > "$PIDFILE"; exec "$@"' nexus-agent "$@" < "$BRIEF" > "$LOG" 2>&1 &
i=0
while [ ! -s "$PIDFILE" ]; do
	i=$((i+1))
	if [ $i -gt 100 ]; then echo "the agent did not start" >&2; exit 1; fi
	sleep 0.1
done
cat "$PIDFILE"
`

func (s *Server) delegateAgentDispatch(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a dispatchArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Sandbox == "" || strings.TrimSpace(a.Brief) == "" {
		return nil, errdefs.Invalid("sandbox and brief are required")
	}
	if len(a.Brief) > MaxBrief {
		return nil, errdefs.Invalid("brief is %d bytes, more than %d", len(a.Brief), MaxBrief)
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	d, sb, err := s.lookup(ctx, c, a.Sandbox)
	if err != nil {
		return nil, err
	}
	if sb == nil {
		return nil, errdefs.NotFound("sandbox %s is gone", d.Sandbox)
	}
	argv := a.Command
	if len(argv) == 0 {
		p, err := profile.Get(sb.Agent)
		if err != nil {
			return nil, err
		}
		argv = p.LaunchCommand
	}
	if len(argv) == 0 || !strings.HasPrefix(argv[0], "/") {
		return nil, errdefs.Invalid("the agent command must start with an absolute path, got %q", strings.Join(argv, " "))
	}
	env := []string{"BRIEF=" + briefPath, "LOG=" + agentLog, "PIDFILE=" + agentPID, "WORKSPACE=" + workspace,
		// The worktree is owned by the host user: let git in the guest use it.
		"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=safe.directory", "GIT_CONFIG_VALUE_0=*"}
	cmd := append([]string{"/bin/sh", "-c", launchScript, "nexus-dispatch"}, argv...)
	brief := a.Brief
	res, err := runCommand(ctx, c, api.ExecRequest{Name: sb.Name, Argv: cmd, Env: env}, &brief, time.Minute)
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("deliver the brief to %s: exit status %d: %s", sb.Name, res.ExitCode, oneLine(res.Stderr+" "+res.Error))
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
	return DispatchResult{Sandbox: sb.Name, BriefPath: briefPath, Command: argv, PID: pid, Log: agentLog}, nil
}

type pollArgs struct {
	Sandbox string `json:"sandbox"`
	Commits int    `json:"commits"`
}

// PollResult is a delegation's progress.
type PollResult struct {
	Sandbox string   `json:"sandbox"`
	Branch  string   `json:"branch"`
	Log     []string `json:"log"`
	Status  []string `json:"status"`
	Dirty   bool     `json:"dirty"`
	// Head is what the worktree has checked out when it is not the delegation's branch.
	Head string `json:"head,omitempty"`
	// Agent is "running" or "exited" when the sandbox could be asked.
	Agent string `json:"agent,omitempty"`
}

func (s *Server) delegateAgentPoll(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a pollArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Sandbox == "" {
		return nil, errdefs.Invalid("sandbox is required")
	}
	n := a.Commits
	if n <= 0 {
		n = 10
	}
	n = min(n, 100)
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	d, sb, err := s.lookup(ctx, c, a.Sandbox)
	if err != nil {
		return nil, err
	}
	if err := d.syncBranch(ctx); err != nil {
		s.log.Warn().Err(err).Str("delegation", d.Name).Msg("branch not synced")
	}
	res := PollResult{Sandbox: d.Sandbox, Branch: d.Branch}
	if res.Log, err = d.log(ctx, n); err != nil {
		return nil, err
	}
	if res.Status, err = d.status(ctx); err != nil {
		return nil, err
	}
	res.Dirty = len(res.Status) > 0
	if h := d.head(); h != "" && h != d.Branch {
		res.Head = h
	}
	if sb != nil && sb.State == api.StateRunning {
		out, err := runCommand(ctx, c, api.ExecRequest{Name: sb.Name, Argv: []string{"/bin/sh", "-c", `kill -0 "$(cat ` + agentPID + ` 2>/dev/null)" 2>/dev/null`}}, nil, 10*time.Second)
		if err == nil {
			res.Agent = map[bool]string{true: "running", false: "exited"}[out.ExitCode == 0]
		}
	}
	return res, nil
}

type teardownArgs struct {
	Sandbox string `json:"sandbox"`
	Force   bool   `json:"force"`
}

// TeardownResult says what teardown removed; the branch is kept.
type TeardownResult struct {
	Sandbox   string   `json:"sandbox"`
	Branch    string   `json:"branch"`
	Head      string   `json:"head"`
	Worktree  string   `json:"worktree"`
	Discarded []string `json:"discarded,omitempty"`
}

func (s *Server) delegateTeardown(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a teardownArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Sandbox == "" {
		return nil, errdefs.Invalid("sandbox is required")
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	s.delegMu.Lock()
	defer s.delegMu.Unlock()
	d, _, err := s.lookup(ctx, c, a.Sandbox)
	if err != nil {
		return nil, err
	}
	if err := d.syncBranch(ctx); err != nil {
		s.log.Warn().Err(err).Str("delegation", d.Name).Msg("branch not synced")
	}
	var changed []string
	if _, err := os.Stat(d.Worktree); err == nil {
		status, err := d.status(ctx)
		if err != nil && !a.Force {
			return nil, fmt.Errorf("check the worktree %s for changes: %w (pass force:true to remove it anyway)", d.Worktree, err)
		}
		for _, l := range status {
			if len(l) > 3 {
				changed = append(changed, l[3:])
			}
		}
	}
	if len(changed) > 0 && !a.Force {
		return nil, &toolError{
			msg: fmt.Sprintf("worktree %s of %s has uncommitted changes in %d files: %s; commit them or pass force:true to discard them",
				d.Worktree, d.Sandbox, len(changed), strings.Join(changed, ", ")),
			details: map[string]any{"sandbox": d.Sandbox, "worktree": d.Worktree, "branch": d.Branch, "changed_files": changed},
		}
	}
	if err := s.removeOwned(d.Sandbox, delegateLabel, d.Name); err != nil {
		return nil, fmt.Errorf("remove sandbox %s: %w (the worktree is kept; try again)", d.Sandbox, err)
	}
	// --force: a clean-check would run git with the worktree's (guest-writable) git dir.
	if _, err := runGit(ctx, nil, "-C", d.Repo, "worktree", "remove", "--force", d.Worktree); err != nil {
		s.log.Info().Err(err).Str("worktree", d.Worktree).Msg("git worktree remove failed; removing the directory")
		if err := os.RemoveAll(d.Worktree); err != nil {
			return nil, fmt.Errorf("remove worktree %s: %w", d.Worktree, err)
		}
		runGit(ctx, nil, "-C", d.Repo, "worktree", "prune")
	}
	head, _ := runGit(ctx, nil, "--git-dir="+d.CommonDir, "rev-parse", "--verify", "--quiet", d.ref())
	if err := os.RemoveAll(d.dir); err != nil {
		return nil, err
	}
	res := TeardownResult{Sandbox: d.Sandbox, Branch: d.Branch, Head: strings.TrimSpace(head), Worktree: d.Worktree}
	if a.Force {
		res.Discarded = changed
	}
	return res, nil
}
