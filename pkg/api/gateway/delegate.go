package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Worktree delegation verbs: a git worktree of a host repository on a branch nexus/<name>,
// mounted at /workspace of its own sandbox, where an agent works on a brief. The gateway owns
// the delegations (their records and the host git), so any number of clients may drive them.
var (
	DelegateCreate   = bus.Endpoint[DelegateCreateRequest, *WorktreeResult]{Scope: bus.GatewayAPI, Verb: "delegate.create"}
	DelegateDispatch = bus.Endpoint[DispatchRequest, *DispatchResult]{Scope: bus.GatewayAPI, Verb: "delegate.dispatch"}
	DelegatePoll     = bus.Endpoint[PollRequest, *PollResult]{Scope: bus.GatewayAPI, Verb: "delegate.poll"}
	DelegateTeardown = bus.Endpoint[TeardownRequest, TeardownReply]{Scope: bus.GatewayAPI, Verb: "delegate.teardown"}
)

// Delegation constants the clients show or check.
const (
	// DelegateLabel marks a delegation's sandbox with the delegation's name.
	DelegateLabel = "nexus.delegate"
	// BranchLabel records the worktree's branch: the branch policy of the sandbox.
	BranchLabel = "nexus.branch"
	// BriefPath is where dispatch writes the brief in the guest (outside the worktree so it
	// does not show in git status).
	BriefPath = "/run/nexus/brief.md"
	// AgentLog is where the dispatched agent's output goes in the guest.
	AgentLog = "/run/nexus/agent.log"
	// MaxBrief bounds a brief.
	MaxBrief = 1 << 20
	// DefaultPollCommits and MaxPollCommits bound how much of the branch's log a poll returns.
	DefaultPollCommits = 10
	MaxPollCommits     = 100
)

// DelegateTimeout bounds a delegate create (a sandbox create and the host git around it) and
// a teardown.
const DelegateTimeout = CreateTimeout + 2*time.Minute

// DispatchTimeout bounds a dispatch: the brief's delivery and the agent's start in the guest
// (one minute) and the exec around it.
const DispatchTimeout = 2 * time.Minute

// DelegateCreateRequest asks for a new delegation of the repository at RepoPath; zero values
// take the defaults (name task-<random>, base HEAD, image nexus-base).
type DelegateCreateRequest struct {
	RepoPath     string   `json:"repo_path"`
	Name         string   `json:"name,omitempty"`
	Base         string   `json:"base,omitempty"`
	Project      string   `json:"project,omitempty"`
	Image        string   `json:"image,omitempty"`
	Memory       int      `json:"memory,omitempty"`
	VCPUs        int      `json:"vcpus,omitempty"`
	Agent        string   `json:"agent,omitempty"`
	Egress       string   `json:"egress,omitempty"`
	AllowedHosts []string `json:"allowed_hosts,omitempty"`
	// Progress, when set, receives the sandbox's boot steps (as CreateRequest.Progress).
	Progress string `json:"progress,omitempty"`
}

// WorktreeResult describes a new delegation.
type WorktreeResult struct {
	Sandbox  string   `json:"sandbox"`
	Branch   string   `json:"branch"`
	Worktree string   `json:"worktree"`
	Base     string   `json:"base"`
	Mount    string   `json:"mount"`
	Record   *Sandbox `json:"record"`
}

// DispatchRequest submits a brief to the agent of a delegation's sandbox; Command, when set,
// is launched instead of the agent profile's command (absolute path first).
type DispatchRequest struct {
	Sandbox string   `json:"sandbox"`
	Brief   string   `json:"brief"`
	Command []string `json:"command,omitempty"`
}

// DispatchResult says the brief was delivered and the agent started.
type DispatchResult struct {
	Sandbox   string   `json:"sandbox"`
	BriefPath string   `json:"brief_path"`
	Command   []string `json:"command"`
	PID       int      `json:"pid"`
	Log       string   `json:"log"`
}

// PollRequest asks for a delegation's progress with its Commits most recent commits.
type PollRequest struct {
	Sandbox string `json:"sandbox"`
	Commits int    `json:"commits,omitempty"`
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

// TeardownRequest removes a delegation's sandbox and worktree; Force discards uncommitted
// changes.
type TeardownRequest struct {
	Sandbox string `json:"sandbox"`
	Force   bool   `json:"force,omitempty"`
}

// TeardownResult says what teardown removed; the branch is kept.
type TeardownResult struct {
	Sandbox   string   `json:"sandbox"`
	Branch    string   `json:"branch"`
	Head      string   `json:"head"`
	Worktree  string   `json:"worktree"`
	Discarded []string `json:"discarded,omitempty"`
}

// DirtyError is a teardown refused because the worktree has uncommitted changes. It is a
// conflict (errors.Is(err, errdefs.ErrConflict)) that carries the changed files.
type DirtyError struct {
	Message      string   `json:"message"`
	Sandbox      string   `json:"sandbox"`
	Worktree     string   `json:"worktree"`
	Branch       string   `json:"branch"`
	ChangedFiles []string `json:"changed_files"`
}

func (e *DirtyError) Error() string        { return e.Message }
func (e *DirtyError) Is(target error) bool { return target == errdefs.ErrConflict }

// TeardownReply is the wire form of a teardown: its result, or the dirty worktree that kept it
// from happening (the envelope's error has no room for the changed files).
type TeardownReply struct {
	Done  *TeardownResult `json:"done,omitempty"`
	Dirty *DirtyError     `json:"dirty,omitempty"`
}

// NewTeardownReply is what the gateway's teardown handler answers for res or err.
func NewTeardownReply(res *TeardownResult, err error) (TeardownReply, error) {
	var dirty *DirtyError
	if errors.As(err, &dirty) {
		return TeardownReply{Dirty: dirty}, nil
	}
	if err != nil {
		return TeardownReply{}, err
	}
	return TeardownReply{Done: res}, nil
}

func (c *Client) DelegateCreate(ctx context.Context, r DelegateCreateRequest) (*WorktreeResult, error) {
	return DelegateCreate.Call(ctx, c.nc, "", r)
}
func (c *Client) DelegateDispatch(ctx context.Context, r DispatchRequest) (*DispatchResult, error) {
	return DelegateDispatch.Call(ctx, c.nc, "", r)
}
func (c *Client) DelegatePoll(ctx context.Context, r PollRequest) (*PollResult, error) {
	return DelegatePoll.Call(ctx, c.nc, "", r)
}

// DelegateTeardown tears a delegation down; a dirty worktree without Force is a *DirtyError.
func (c *Client) DelegateTeardown(ctx context.Context, r TeardownRequest) (*TeardownResult, error) {
	rep, err := DelegateTeardown.Call(ctx, c.nc, "", r)
	switch {
	case err != nil:
		return nil, err
	case rep.Dirty != nil:
		return nil, rep.Dirty
	case rep.Done == nil:
		return nil, errdefs.New(errdefs.ErrInternal, "teardown: the gateway answered neither a result nor an error")
	}
	return rep.Done, nil
}
