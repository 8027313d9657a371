package httpapi

import (
	"context"
	"net/http"
	"strconv"
	"time"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

// route is one row of the API: its method and path (http.ServeMux syntax), the scope a token
// needs, and its handler. A handler returning an error before writing answers that error.
// A sandbox name project/name is one path segment: write its slash as %2F, or give the name
// alone for project default.
type route struct {
	Method, Path string
	Scope        Scope
	Summary      string
	handle       func(s *Service, w http.ResponseWriter, r *http.Request) error
}

// Deadlines of the bus calls behind the routes.
const (
	callTimeout      = 30 * time.Second
	lifecycleTimeout = 5 * time.Minute
)

// Routes is the API, in the order the OpenAPI document lists it.
var Routes = []route{
	{"GET", "/v1/sandboxes", ScopeRead, "List sandboxes (selector: label selector, repeatable; all: include stopped and failed)", listSandboxes},
	{"POST", "/v1/sandboxes", ScopeWrite, "Create and boot a sandbox (admin for mounts, secrets, a config with secrets, and agents that live-mount host credentials)", createSandbox},
	{"GET", "/v1/sandboxes/{name}", ScopeRead, "Get one sandbox's record", getSandbox},
	{"DELETE", "/v1/sandboxes/{name}", ScopeWrite, "Remove a sandbox and everything it owns (force: even if running; default true)", lifecycle(api.Remove, true)},
	{"POST", "/v1/sandboxes/{name}/start", ScopeWrite, "Start a created or stopped sandbox", lifecycle(api.Start, false)},
	{"POST", "/v1/sandboxes/{name}/stop", ScopeWrite, "Stop a sandbox, keeping its disk (force: kill the VM)", lifecycle(api.Stop, false)},
	{"POST", "/v1/sandboxes/{name}/pause", ScopeWrite, "Pause a running sandbox", lifecycle(api.Pause, false)},
	{"POST", "/v1/sandboxes/{name}/resume", ScopeWrite, "Resume a paused sandbox", lifecycle(api.Resume, false)},
	{"POST", "/v1/sandboxes/{name}/exec", ScopeWrite, "Run a command and wait: {exit_code, stdout, stderr, …}", execOnce},
	{"POST", "/v1/sandboxes/{name}/exec/stream", ScopeWrite, "Run a command and stream its output as it comes: frames of channel (1 stdout, 2 stderr, 3 exit), uint32 length, bytes; the last holds {type: exit|error, exit_code, …}", execStream},
	{"POST", "/v1/sandboxes/{name}/exec/ticket", ScopeWrite, "A single-use ticket, valid 30 s, that opens this sandbox's exec WebSocket as ?ticket= without an Authorization header (browsers cannot set one)", execTicket},
	{"GET", "/v1/sandboxes/{name}/exec/ws", ScopeWrite, "Run a command over a WebSocket: stdin, stdout, stderr, PTY resize, exit status", execWebSocket},
	{"GET", "/v1/sandboxes/{name}/logs", ScopeRead, "Console log from offset (agent: the guest agent's log); follow: Server-Sent Events", sandboxLogs},
	{"GET", "/v1/sandboxes/{name}/ports", ScopeRead, "The sandbox's port forwards", sandboxPorts},
	{"GET", "/v1/sandboxes/{name}/egress", ScopeRead, "The sandbox's effective egress: mode, allowlist, DNS table, counters", egressShow},
	{"POST", "/v1/sandboxes/{name}/egress/explain", ScopeRead, "The decision the perimeter would make on a request, and which rule makes it", egressExplain},
	{"POST", "/v1/sandboxes/{name}/egress/allow", ScopeAdmin, "Grant egress to host[:port,…] now, on a running sandbox too: {host, for} (admin: it opens the perimeter, to a secret's hosts too)", egressChange(api.EgressAllow)},
	{"POST", "/v1/sandboxes/{name}/egress/revoke", ScopeWrite, "Revoke a live grant, closing its open connections: {host}", egressChange(api.EgressRevoke)},
	{"POST", "/v1/sandboxes/{name}/egress/deny", ScopeWrite, "Deny a host over every allow rule: {host, for}", egressChange(api.EgressDeny)},
	{"POST", "/v1/sandboxes/{name}/egress/apply", ScopeAdmin, "Apply a project config's egress to the sandbox: {config, dry_run}", egressApply},
	{"GET", "/v1/sandboxes/{name}/files", ScopeRead, "List a guest directory (path)", filesList},
	{"GET", "/v1/sandboxes/{name}/files/stat", ScopeRead, "Stat a guest path (path)", filesStat},
	{"GET", "/v1/sandboxes/{name}/files/content", ScopeRead, "Download a guest file (path)", filesDownload},
	{"PUT", "/v1/sandboxes/{name}/files/content", ScopeWrite, "Upload a file to a guest path (path, mode); needs Content-Length", filesUpload},
	{"GET", "/v1/sandboxes/{name}/files/tar", ScopeRead, "Download a guest directory tree as a tar archive (path)", filesTarGet},
	{"PUT", "/v1/sandboxes/{name}/files/tar", ScopeWrite, "Unpack a tar archive into a guest directory (path), creating it", filesTarPut},
	{"POST", "/v1/sandboxes/{name}/files/mkdir", ScopeWrite, "Create a guest directory and its parents (path)", filesMkdir},
	{"DELETE", "/v1/sandboxes/{name}/files", ScopeWrite, "Remove a guest path (path; recursive for a directory)", filesRemove},
	{"POST", "/v1/sandboxes/{name}/snapshots", ScopeWrite, "Snapshot a running or paused sandbox: {snapshot}", snapshotCreate},
	{"GET", "/v1/ports", ScopeRead, "Every sandbox's port forwards", allPorts},
	{"GET", "/v1/stats", ScopeRead, "What running sandboxes use now (name: repeatable; selector)", stats},
	{"GET", "/v1/audit", ScopeRead, "Egress decisions as Server-Sent Events (sandbox: repeatable; denied; since; follow); api: the API's own request events instead (admin; token: repeatable)", auditEvents},
	{"GET", "/v1/snapshots", ScopeRead, "List snapshots and the sandboxes forked from them", snapshotList},
	{"DELETE", "/v1/snapshots/{snapshot}", ScopeWrite, "Remove a snapshot", snapshotRemove},
	{"POST", "/v1/forks", ScopeWrite, "Boot a new sandbox from a snapshot or a sandbox: {source, name, labels}", fork},
	{"GET", "/v1/volumes", ScopeRead, "List named volumes", volumeList},
	{"DELETE", "/v1/volumes/{sandbox}/{volume}", ScopeWrite, "Remove a stopped sandbox's volume", volumeRemove},
	{"GET", "/v1/images", ScopeRead, "List images", imageList},
	{"POST", "/v1/images/{image}/build", ScopeWrite, "Build (or rebuild with force) an image", imageOp("build")},
	{"POST", "/v1/builds/{image}", ScopeWrite, "Build image NAME[:TAG] from a Dockerfile over an uploaded context, as nexus image build -f (a tar; file: the Dockerfile in it; build_arg: NAME=VALUE, repeatable; allow_host: repeatable; memory_mib; no_cache)", dockerBuild},
	{"DELETE", "/v1/images/{image}", ScopeWrite, "Remove an image (force: even if sandboxes use it)", imageOp("rm")},
	{"GET", "/v1/secrets", ScopeAdmin, "List the stored secrets' names and hosts (never values)", secretList},
	{"PUT", "/v1/secrets/{secret}", ScopeAdmin, "Store a secret: {value or command, hosts}", secretSet},
	{"DELETE", "/v1/secrets/{secret}", ScopeAdmin, "Remove a secret", secretRemove},
	{"POST", "/v1/delegations", ScopeAdmin, "Create a worktree delegation of a host repository", delegateCreate},
	{"POST", "/v1/delegations/{sandbox}/dispatch", ScopeAdmin, "Submit a brief to a delegation's agent", delegateDispatch},
	{"GET", "/v1/delegations/{sandbox}", ScopeAdmin, "A delegation's branch, recent commits and status", delegatePoll},
	{"DELETE", "/v1/delegations/{sandbox}", ScopeAdmin, "Remove a delegation's sandbox and worktree (force: discard changes)", delegateTeardown},
}

// routes builds the mux: every row behind its scope check, /openapi.json, /mcp, and the guard
// around all of them.
func (s *Service) routes() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range Routes {
		mux.HandleFunc(rt.Method+" "+rt.Path, func(w http.ResponseWriter, r *http.Request) {
			if err := need(r, rt.Scope, rt.Method+" "+rt.Path); err != nil {
				writeError(w, err)
				return
			}
			if err := rt.handle(s, w, r); err != nil {
				writeError(w, err)
			}
		})
	}
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(OpenAPI)
	})
	mux.Handle("/mcp", s.mcpHandler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errdefs.NotFound("no route %s %s (GET /openapi.json lists them)", r.Method, clip(r.URL.Path)))
	})
	return s.guard(mux)
}

func withTimeout(r *http.Request, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), d)
}

func boolQuery(r *http.Request, key string, def bool) (bool, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.Invalid("invalid %s %q: use true or false", key, clip(v))
	}
	return b, nil
}

// call runs one bus call under the call deadline and answers its result as JSON.
func call[T any](s *Service, w http.ResponseWriter, r *http.Request, d time.Duration, status int, fn func(context.Context, *api.Client) (T, error)) error {
	ctx, cancel := withTimeout(r, d)
	defer cancel()
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	v, err := fn(ctx, c)
	if err != nil {
		return err
	}
	writeJSON(w, status, v)
	return nil
}

// listResult is the body of GET /v1/sandboxes.
type listResult struct {
	Sandboxes []api.SandboxView `json:"sandboxes"`
}

func listSandboxes(s *Service, w http.ResponseWriter, r *http.Request) error {
	all, err := boolQuery(r, "all", false)
	if err != nil {
		return err
	}
	req := api.ListRequest{Selector: r.URL.Query()["selector"], All: all}
	if _, err := api.ParseSelector(req.Selector...); err != nil {
		return err
	}
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (listResult, error) {
		l, err := c.List(ctx, req)
		if l == nil {
			l = []api.SandboxView{}
		}
		return listResult{Sandboxes: l}, err
	})
}

func getSandbox(s *Service, w http.ResponseWriter, r *http.Request) error {
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (*api.Sandbox, error) {
		return c.Get(ctx, r.PathValue("name"))
	})
}

// createAdminReason says why a create needs an admin token, or "" when write is enough: what
// reaches the host's own files or secrets.
func createAdminReason(req *api.CreateRequest) string {
	switch {
	case len(req.Mounts) > 0:
		return "mounting host paths"
	case len(req.Secrets) > 0 || req.UserSecrets:
		return "binding secrets"
	case req.Config != nil && len(req.Config.Egress.Secrets) > 0:
		return "a config that binds secrets"
	}
	name := req.Agent
	if name == "" {
		name = profile.DefaultName
	}
	if p, err := profile.Get(name); err == nil && p.CredDirLiveMount {
		return "agent " + name + " (it live-mounts the host's ~/" + p.CredDir + "; another agent, such as codex, needs only write)"
	}
	return ""
}

// limitCreate keeps a create by a caller below admin away from the host's stored secrets: none
// is bound by default (--repo's GH_TOKEN, the agent profile's); binding one by name already
// needs admin (createAdminReason).
func limitCreate(ctx context.Context, r *api.CreateRequest) {
	if tok, ok := callerOf(ctx); !ok || !tok.Scope.Allows(ScopeAdmin) {
		r.NoStoredSecrets = true
	}
}

func createSandbox(s *Service, w http.ResponseWriter, r *http.Request) error {
	var req api.CreateRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return errdefs.Invalid("name is required")
	}
	req.Progress = "" // a bus subject: never the caller's to choose
	limitCreate(r.Context(), &req)
	if why := createAdminReason(&req); why != "" {
		if err := need(r, ScopeAdmin, "sandbox create with "+why); err != nil {
			return err
		}
	}
	return call(s, w, r, api.CreateTimeout+time.Minute, http.StatusCreated, func(ctx context.Context, c *api.Client) (*api.Sandbox, error) {
		return c.Create(ctx, req)
	})
}

// lifecycle is a route applying verb to the sandbox of the path; force is the default of ?force.
func lifecycle(verb api.Lifecycle, force bool) func(*Service, http.ResponseWriter, *http.Request) error {
	return func(s *Service, w http.ResponseWriter, r *http.Request) error {
		f, err := boolQuery(r, "force", force)
		if err != nil {
			return err
		}
		name := r.PathValue("name")
		ctx, cancel := withTimeout(r, lifecycleTimeout)
		defer cancel()
		c, err := s.client(ctx)
		if err != nil {
			return err
		}
		res, err := c.Apply(ctx, verb, api.NamesRequest{Names: []string{name}, Force: f})
		if err != nil {
			return err
		}
		for _, one := range res {
			if one.Error != "" {
				return errdefs.FromCode(one.Code, one.Error)
			}
		}
		if len(res) != 1 {
			return errdefs.Invalid("%s: no sandbox answered", name)
		}
		writeJSON(w, http.StatusOK, res[0])
		return nil
	}
}

func sandboxPorts(s *Service, w http.ResponseWriter, r *http.Request) error {
	return ports(s, w, r, r.PathValue("name"))
}

func allPorts(s *Service, w http.ResponseWriter, r *http.Request) error { return ports(s, w, r, "") }

func ports(s *Service, w http.ResponseWriter, r *http.Request, name string) error {
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (any, error) {
		f, err := c.Ports(ctx, name)
		if f == nil {
			return map[string]any{"ports": []any{}}, err
		}
		return map[string]any{"ports": f}, err
	})
}

func stats(s *Service, w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	req := api.StatsRequest{Names: q["name"], Selector: q["selector"]}
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (any, error) {
		st, err := c.Stats(ctx, req)
		if st == nil {
			st = []api.SandboxStats{}
		}
		return map[string]any{"stats": st}, err
	})
}

func egressShow(s *Service, w http.ResponseWriter, r *http.Request) error {
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (api.EgressView, error) {
		return c.EgressShow(ctx, r.PathValue("name"))
	})
}

func egressExplain(s *Service, w http.ResponseWriter, r *http.Request) error {
	var req api.ExplainRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	req.Name = r.PathValue("name")
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (api.Explanation, error) {
		return c.EgressExplain(ctx, req)
	})
}

// EgressChangeBody is the body of the live egress routes: For is a Go duration ("10m"), empty
// until revoked.
type EgressChangeBody struct {
	Host string `json:"host"`
	For  string `json:"for,omitempty"`
}

// by names the caller in the records of a live change: the token's name, through the api.
func by(r *http.Request) (string, string) {
	tok, _ := callerOf(r.Context())
	return "token " + tok.Name, "api"
}

func egressChange(verb bus.Endpoint[api.EgressChangeRequest, api.EgressChange]) func(*Service, http.ResponseWriter, *http.Request) error {
	return func(s *Service, w http.ResponseWriter, r *http.Request) error {
		var b EgressChangeBody
		if err := decode(w, r, &b); err != nil {
			return err
		}
		req := api.EgressChangeRequest{Name: r.PathValue("name"), Host: b.Host}
		if b.For != "" {
			d, err := time.ParseDuration(b.For)
			if err != nil || d <= 0 {
				return errdefs.Invalid("invalid for %q: use a duration like 10m or 2h", clip(b.For))
			}
			req.For = d
		}
		req.By, req.Via = by(r)
		return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (api.EgressChange, error) {
			return verb.Call(ctx, c.Conn(), "", req)
		})
	}
}

func egressApply(s *Service, w http.ResponseWriter, r *http.Request) error {
	var req api.EgressApplyRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	req.Name = r.PathValue("name")
	req.By, req.Via = by(r)
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (api.EgressChange, error) {
		return c.EgressApply(ctx, req)
	})
}

func snapshotCreate(s *Service, w http.ResponseWriter, r *http.Request) error {
	var req api.SnapshotCreateRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	req.Sandbox = r.PathValue("name")
	return call(s, w, r, api.SnapshotTimeout+time.Minute, http.StatusCreated, func(ctx context.Context, c *api.Client) (*api.Snapshot, error) {
		return c.SnapshotCreate(ctx, req)
	})
}

func snapshotList(s *Service, w http.ResponseWriter, r *http.Request) error {
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (any, error) {
		l, err := c.SnapshotList(ctx)
		if l == nil {
			l = []api.SnapshotView{}
		}
		return map[string]any{"snapshots": l}, err
	})
}

func snapshotRemove(s *Service, w http.ResponseWriter, r *http.Request) error {
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (api.Empty, error) {
		return api.Empty{}, c.SnapshotRemove(ctx, r.PathValue("snapshot"))
	})
}

func fork(s *Service, w http.ResponseWriter, r *http.Request) error {
	var req api.ForkRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	req.Progress = ""
	return call(s, w, r, api.SnapshotTimeout+api.CreateTimeout, http.StatusCreated, func(ctx context.Context, c *api.Client) (*api.Sandbox, error) {
		return c.Fork(ctx, req)
	})
}

func volumeList(s *Service, w http.ResponseWriter, r *http.Request) error {
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (any, error) {
		l, err := c.VolumeList(ctx)
		if l == nil {
			l = []api.VolumeView{}
		}
		return map[string]any{"volumes": l}, err
	})
}

func volumeRemove(s *Service, w http.ResponseWriter, r *http.Request) error {
	req := api.VolumeRemoveRequest{Sandbox: r.PathValue("sandbox"), Volume: r.PathValue("volume")}
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (api.Empty, error) {
		return api.Empty{}, c.VolumeRemove(ctx, req)
	})
}

func imageList(s *Service, w http.ResponseWriter, r *http.Request) error {
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (any, error) {
		l, err := c.Images(ctx)
		if l == nil {
			l = []vmmapi.ImageInfo{}
		}
		return map[string]any{"images": l}, err
	})
}

func imageOp(op string) func(*Service, http.ResponseWriter, *http.Request) error {
	return func(s *Service, w http.ResponseWriter, r *http.Request) error {
		force, err := boolQuery(r, "force", false)
		if err != nil {
			return err
		}
		req := vmmapi.ImageRequest{Op: op, Name: r.PathValue("image"), Force: force}
		return call(s, w, r, api.ImageTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (vmmapi.ImageInfo, error) {
			return c.Image(ctx, req)
		})
	}
}

func secretList(s *Service, w http.ResponseWriter, r *http.Request) error {
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (credapi.SecretListResponse, error) {
		return c.SecretList(ctx)
	})
}

func secretSet(s *Service, w http.ResponseWriter, r *http.Request) error {
	var req credapi.SecretSetRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	req.Name = r.PathValue("secret")
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (api.Empty, error) {
		return api.Empty{}, c.SecretSet(ctx, req)
	})
}

func secretRemove(s *Service, w http.ResponseWriter, r *http.Request) error {
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (api.Empty, error) {
		return api.Empty{}, c.SecretRemove(ctx, r.PathValue("secret"))
	})
}

func delegateCreate(s *Service, w http.ResponseWriter, r *http.Request) error {
	var req api.DelegateCreateRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	req.Progress = ""
	return call(s, w, r, api.DelegateTimeout, http.StatusCreated, func(ctx context.Context, c *api.Client) (*api.WorktreeResult, error) {
		return c.DelegateCreate(ctx, req)
	})
}

func delegateDispatch(s *Service, w http.ResponseWriter, r *http.Request) error {
	var req api.DispatchRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	req.Sandbox = r.PathValue("sandbox")
	return call(s, w, r, api.DispatchTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (*api.DispatchResult, error) {
		return c.DelegateDispatch(ctx, req)
	})
}

func delegatePoll(s *Service, w http.ResponseWriter, r *http.Request) error {
	req := api.PollRequest{Sandbox: r.PathValue("sandbox")}
	if v := r.URL.Query().Get("commits"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errdefs.Invalid("invalid commits %q: use a count", clip(v))
		}
		req.Commits = n
	}
	return call(s, w, r, callTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (*api.PollResult, error) {
		return c.DelegatePoll(ctx, req)
	})
}

func delegateTeardown(s *Service, w http.ResponseWriter, r *http.Request) error {
	force, err := boolQuery(r, "force", false)
	if err != nil {
		return err
	}
	req := api.TeardownRequest{Sandbox: r.PathValue("sandbox"), Force: force}
	return call(s, w, r, api.DelegateTimeout, http.StatusOK, func(ctx context.Context, c *api.Client) (*api.TeardownResult, error) {
		return c.DelegateTeardown(ctx, req)
	})
}
