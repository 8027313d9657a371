package gateway

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
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/gateway/internal/worktree"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/pkg/profile"
	"github.com/IniZio/nexus/pkg/records"
)

// Worktree delegation (the delegate.* verbs; seed "worktree-native parallel flow"): each task
// gets a git worktree of a host repo on its own branch nexus/<name>, mounted at /workspace of
// its own sandbox; the in-guest agent commits there; teardown removes the sandbox and the
// worktree and keeps the branch. The host git is gateway/internal/worktree.
//
// The gateway owns the delegations, whoever asks (CLI, any number of MCP servers): their
// records are $NEXUS_HOME/delegations/<name>.json, their working files <name>/ beside them.
// Everything that reads or writes one delegation holds its name's lock, and what changes a
// repository (worktree add and remove) also holds the repository's.

// agentPID is where the dispatched agent writes its pid in the guest.
const agentPID = "/run/nexus/agent.pid"

var delegNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// delegation is the record of one delegation.
type delegation struct {
	worktree.Tree
	Sandbox string    `json:"sandbox"`
	Created time.Time `json:"created"`
}

// delegations is the gateway's store of delegations and their locks.
type delegations struct {
	home  home.Dir
	store *records.Store[delegation]
	log   zerolog.Logger
	names keyLocks // by delegation name
	repos keyLocks // by repository git dir
}

// legacyState is where builds before the gateway owned delegations kept a record.
const legacyState = "state.json"

// openDelegations opens the store and migrates the records of earlier builds
// (delegations/<name>/state.json) to delegations/<name>.json.
func openDelegations(h home.Dir, log zerolog.Logger) (*delegations, error) {
	store, err := records.Open[delegation](h.Delegations(), log)
	if err != nil {
		return nil, err
	}
	ds := &delegations{home: h, store: store, log: log}
	ents, err := os.ReadDir(h.Delegations())
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if e.IsDir() {
			if _, err := ds.migrate(e.Name()); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				log.Warn().Err(err).Str("delegation", e.Name()).Msg("delegation record not migrated")
			}
		}
	}
	return ds, nil
}

func (ds *delegations) dir(name string) string { return filepath.Join(ds.home.Delegations(), name) }

// migrate moves the legacy record of name, if there is one, to the store.
func (ds *delegations) migrate(name string) (*delegation, error) {
	if records.CheckKey(name) != nil {
		return nil, errdefs.NotFound("no delegation %q", name)
	}
	legacy := filepath.Join(ds.dir(name), legacyState)
	b, err := os.ReadFile(legacy)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.NotFound("no delegation %q", name)
	}
	if err != nil {
		return nil, err
	}
	var d delegation
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("delegation %s: damaged state file: %w", name, err)
	}
	if d.Name != name {
		return nil, fmt.Errorf("delegation %s: its state file names %q", name, d.Name)
	}
	if err := ds.store.Put(name, d); err != nil {
		return nil, err
	}
	if err := os.Remove(legacy); err != nil {
		return nil, err
	}
	ds.log.Info().Str("delegation", name).Msg("delegation record migrated to " + name + records.Ext)
	d.Dir = ds.dir(name)
	return &d, nil
}

// get loads the record of name (the caller holds its lock).
func (ds *delegations) get(name string) (*delegation, error) {
	d, err := ds.store.Get(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		if m, merr := ds.migrate(name); !errors.Is(merr, errdefs.ErrNotFound) {
			return m, merr
		}
		return nil, errdefs.NotFound("no delegation %q: create one with delegate_worktree_create (nexus delegate create)", name)
	}
	if err != nil {
		return nil, err
	}
	d.Dir = ds.dir(name)
	return &d, nil
}

func (ds *delegations) put(d *delegation) error { return ds.store.Put(d.Name, *d) }

// keyLocks is a mutex per key, dropped when nobody holds or waits for it.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	refs int
}

// lock takes the lock of key and returns its unlock.
func (k *keyLocks) lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

func (g *Service) delegs() (*delegations, error) {
	if g.deleg == nil {
		return nil, errdefs.Unavailable("worktree delegation needs the gateway's home directory")
	}
	return g.deleg, nil
}

func (g *Service) delegateCreate(ctx context.Context, r api.DelegateCreateRequest) (*api.WorktreeResult, error) {
	ds, err := g.delegs()
	if err != nil {
		return nil, err
	}
	if r.RepoPath == "" {
		return nil, errdefs.Invalid("repo_path is required")
	}
	if r.Name == "" {
		r.Name = "task-" + randomHex(3)
	}
	if !delegNameRE.MatchString(r.Name) {
		return nil, errdefs.Invalid("invalid name %q: 1-63 of a-z 0-9 - _ starting with a letter or digit", r.Name)
	}
	if r.Base == "" {
		r.Base = "HEAD"
	}
	if strings.HasPrefix(r.Base, "-") || strings.ContainsAny(r.Base, " \n\t") {
		return nil, errdefs.Invalid("invalid base %q: name a commit, branch or tag", r.Base)
	}
	if r.Agent != "" {
		if _, err := profile.Get(r.Agent); err != nil {
			return nil, err
		}
	}
	sandbox, err := api.FullName(r.Project, r.Name)
	if err != nil {
		return nil, err
	}
	repo, err := worktree.Inspect(ctx, r.RepoPath)
	if err != nil {
		return nil, err
	}
	if _, err := g.reg.Get(ctx, sandbox); err == nil {
		return nil, errdefs.Conflict("sandbox %s already exists", sandbox)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}

	defer ds.names.lock(r.Name)()
	d := &delegation{Tree: *worktree.New(repo, r.Name, filepath.Join(ds.home.Worktrees(), r.Name), ds.dir(r.Name)),
		Sandbox: sandbox, Created: time.Now().UTC()}
	if strings.ContainsAny(d.Worktree+d.Dir, ":\n") {
		return nil, errdefs.Invalid("NEXUS_HOME %s contains ':', which cannot be mounted into a sandbox", ds.home)
	}
	if _, err := ds.get(r.Name); err == nil {
		return nil, errdefs.Conflict("delegation %s already exists: tear it down with delegate_teardown first", r.Name)
	}
	if err := os.MkdirAll(ds.home.Worktrees(), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(d.Dir, 0o700); errors.Is(err, os.ErrExist) {
		return nil, errdefs.Conflict("delegation %s already exists: tear it down with delegate_teardown first", r.Name)
	} else if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			g.rollbackDelegation(d)
		}
	}()
	unlockRepo := ds.repos.lock(d.CommonDir)
	err = d.Add(ctx, r.Base)
	unlockRepo()
	if err != nil {
		return nil, err
	}
	if err := ds.put(d); err != nil {
		return nil, err
	}
	cr := api.CreateRequest{Name: sandbox, Image: r.Image, MemoryMiB: r.Memory, VCPUs: r.VCPUs, Agent: r.Agent,
		EgressMode: r.Egress, AllowHosts: r.AllowedHosts, Progress: r.Progress,
		Labels: map[string]string{api.DelegateLabel: d.Name, api.BranchLabel: d.Branch},
		Mounts: d.Mounts()}
	cctx, cancel := context.WithTimeout(ctx, api.CreateTimeout)
	sb, err := g.create(cctx, cr)
	cancel()
	if err != nil {
		return nil, err
	}
	ok = true
	return &api.WorktreeResult{Sandbox: sb.Name, Branch: d.Branch, Worktree: d.Worktree, Base: d.Base, Mount: d.Worktree + ":" + worktree.Workspace, Record: sb}, nil
}

// rollbackDelegation undoes a delegation that could not be created (the caller holds its
// name's lock).
func (g *Service) rollbackDelegation(d *delegation) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := g.removeOwned(ctx, d.Sandbox, api.DelegateLabel, d.Name); err != nil {
		g.log.Warn().Err(err).Str("sandbox", d.Sandbox).Msg("delegation rollback: sandbox not removed")
	}
	unlock := g.deleg.repos.lock(d.CommonDir)
	d.Discard(ctx)
	unlock()
	os.RemoveAll(d.Dir)
	if err := g.deleg.store.Delete(d.Name); err != nil {
		g.log.Warn().Err(err).Str("delegation", d.Name).Msg("delegation rollback: record not removed")
	}
}

// removeOwned removes sandbox name if its label key holds value (it is the one we made). A
// sandbox that is already gone is fine.
func (g *Service) removeOwned(ctx context.Context, name, key, value string) error {
	sb, err := g.reg.Get(ctx, name)
	if mine, err := api.Owned(sb, err, key, value); !mine {
		return err
	}
	if err := g.remove(ctx, sb, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	return nil
}

// lockDelegation finds the delegation of a sandbox (by its label, or, the sandbox already gone,
// by the name part of the sandbox name), takes its lock and loads it. sb is nil when the
// sandbox is gone.
func (g *Service) lockDelegation(ctx context.Context, sandbox string) (d *delegation, sb *api.Sandbox, unlock func(), err error) {
	ds, err := g.delegs()
	if err != nil {
		return nil, nil, nil, err
	}
	full, err := api.ParseName(sandbox)
	if err != nil {
		return nil, nil, nil, err
	}
	sb, err = g.reg.Get(ctx, full)
	var name string
	switch {
	case err == nil:
		if name = sb.Labels[api.DelegateLabel]; name == "" {
			return nil, nil, nil, errdefs.Invalid("sandbox %s is not a delegation: create one with delegate_worktree_create (nexus delegate create)", sb.Name)
		}
	case errors.Is(err, errdefs.ErrNotFound):
		_, name, _ = strings.Cut(full, "/")
		sb = nil
	default:
		return nil, nil, nil, err
	}
	unlock = ds.names.lock(name)
	d, derr := ds.get(name)
	if derr == nil && sb == nil && d.Sandbox != full {
		derr = err // the name part names another project's delegation
	}
	if derr != nil {
		unlock()
		if sb == nil {
			return nil, nil, nil, err
		}
		return nil, nil, nil, derr
	}
	return d, sb, unlock, nil
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

func (g *Service) delegateDispatch(ctx context.Context, r api.DispatchRequest) (*api.DispatchResult, error) {
	if r.Sandbox == "" || strings.TrimSpace(r.Brief) == "" {
		return nil, errdefs.Invalid("sandbox and brief are required")
	}
	if len(r.Brief) > api.MaxBrief {
		return nil, errdefs.Invalid("brief is %d bytes, more than %d", len(r.Brief), api.MaxBrief)
	}
	d, sb, unlock, err := g.lockDelegation(ctx, r.Sandbox)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb == nil {
		return nil, errdefs.NotFound("sandbox %s is gone", d.Sandbox)
	}
	argv := r.Command
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
	env := []string{"BRIEF=" + api.BriefPath, "LOG=" + api.AgentLog, "PIDFILE=" + agentPID, "WORKSPACE=" + worktree.Workspace,
		// The worktree is owned by the host user: let git in the guest use it.
		"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=safe.directory", "GIT_CONFIG_VALUE_0=*"}
	cmd := append([]string{"/bin/sh", "-c", launchScript, "nexus-dispatch"}, argv...)
	brief := r.Brief
	res, err := g.runIn(ctx, api.ExecRequest{Name: sb.Name, Argv: cmd, Env: env}, &brief, time.Minute)
	if err != nil {
		return nil, err
	}
	if res.exit.Code != 0 {
		return nil, fmt.Errorf("deliver the brief to %s: exit status %d: %s", sb.Name, res.exit.Code,
			strings.Join(strings.Fields(res.stderr.String()+" "+res.exit.Error), " "))
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(res.stdout.String()))
	return &api.DispatchResult{Sandbox: sb.Name, BriefPath: api.BriefPath, Command: argv, PID: pid, Log: api.AgentLog}, nil
}

// syncBranch copies the guest's branch into the repository and records it (the caller holds
// the delegation's lock); a failure is logged, not returned: the host's branch stays as it was.
func (g *Service) syncBranch(ctx context.Context, d *delegation) {
	moved, err := d.Sync(ctx)
	if err == nil && moved {
		err = g.deleg.put(d)
	}
	if err != nil {
		g.log.Warn().Err(err).Str("delegation", d.Name).Msg("branch not synced")
	}
}

func (g *Service) delegatePoll(ctx context.Context, r api.PollRequest) (*api.PollResult, error) {
	if r.Sandbox == "" {
		return nil, errdefs.Invalid("sandbox is required")
	}
	n := r.Commits
	if n <= 0 {
		n = api.DefaultPollCommits
	}
	n = min(n, api.MaxPollCommits)
	d, sb, unlock, err := g.lockDelegation(ctx, r.Sandbox)
	if err != nil {
		return nil, err
	}
	res, err := func() (*api.PollResult, error) {
		defer unlock()
		g.syncBranch(ctx, d)
		res := &api.PollResult{Sandbox: d.Sandbox, Branch: d.Branch}
		var err error
		if res.Log, err = d.Log(ctx, n); err != nil {
			return nil, err
		}
		if res.Status, err = d.Status(ctx); err != nil {
			return nil, err
		}
		res.Dirty = len(res.Status) > 0
		if h := d.Head(); h != "" && h != d.Branch {
			res.Head = h
		}
		return res, nil
	}()
	if err != nil {
		return nil, err
	}
	if sb != nil && sb.State == api.StateRunning {
		out, err := g.runIn(ctx, api.ExecRequest{Name: sb.Name, Argv: []string{"/bin/sh", "-c", `kill -0 "$(cat ` + agentPID + ` 2>/dev/null)" 2>/dev/null`}}, nil, 10*time.Second)
		if err == nil {
			res.Agent = map[bool]string{true: "running", false: "exited"}[out.exit.Code == 0]
		}
	}
	return res, nil
}

func (g *Service) delegateTeardown(ctx context.Context, r api.TeardownRequest) (api.TeardownReply, error) {
	return api.NewTeardownReply(g.teardownDelegation(ctx, r))
}

func (g *Service) teardownDelegation(ctx context.Context, r api.TeardownRequest) (*api.TeardownResult, error) {
	if r.Sandbox == "" {
		return nil, errdefs.Invalid("sandbox is required")
	}
	d, _, unlock, err := g.lockDelegation(ctx, r.Sandbox)
	if err != nil {
		return nil, err
	}
	defer unlock()
	g.syncBranch(ctx, d)
	var changed []string
	if _, err := os.Stat(d.Worktree); err == nil {
		status, err := d.Status(ctx)
		if err != nil && !r.Force {
			return nil, fmt.Errorf("check the worktree %s for changes: %w (pass force:true to remove it anyway)", d.Worktree, err)
		}
		changed = worktree.Changed(status)
	}
	if len(changed) > 0 && !r.Force {
		return nil, &api.DirtyError{
			Message: fmt.Sprintf("worktree %s of %s has uncommitted changes in %d files: %s; commit them or pass force:true to discard them",
				d.Worktree, d.Sandbox, len(changed), strings.Join(changed, ", ")),
			Sandbox: d.Sandbox, Worktree: d.Worktree, Branch: d.Branch, ChangedFiles: changed,
		}
	}
	if err := g.removeOwned(ctx, d.Sandbox, api.DelegateLabel, d.Name); err != nil {
		return nil, fmt.Errorf("remove sandbox %s: %w (the worktree is kept; try again)", d.Sandbox, err)
	}
	unlockRepo := g.deleg.repos.lock(d.CommonDir)
	err = d.Remove(ctx, g.log)
	unlockRepo()
	if err != nil {
		return nil, err
	}
	head := d.BranchHead(ctx)
	if err := os.RemoveAll(d.Dir); err != nil {
		return nil, err
	}
	if err := g.deleg.store.Delete(d.Name); err != nil {
		return nil, err
	}
	res := &api.TeardownResult{Sandbox: d.Sandbox, Branch: d.Branch, Head: head, Worktree: d.Worktree}
	if r.Force {
		res.Discarded = changed
	}
	return res, nil
}
