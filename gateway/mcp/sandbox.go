package mcp

import (
	"context"
	"fmt"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/bytesize"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// createArgs are the arguments of sandbox_create.
type createArgs struct {
	Name         string            `json:"name"`
	Project      string            `json:"project"`
	RemoveOnExit bool              `json:"remove_on_exit"`
	Start        bool              `json:"start"`
	Cold         bool              `json:"cold"`
	Image        string            `json:"image"`
	Memory       int               `json:"memory"`
	VCPUs        int               `json:"vcpus"`
	Agent        string            `json:"agent"`
	Egress       string            `json:"egress"`
	AllowedHosts []string          `json:"allowed_hosts"`
	AllowPrivate []string          `json:"allow_private"`
	Secrets      []string          `json:"secrets"`
	Labels       map[string]string `json:"labels"`
	Repos        []string          `json:"repos"`
	Config       string            `json:"config"`
	TTL          string            `json:"ttl"`
	IdleTimeout  string            `json:"idle_timeout"`
	Disk         string            `json:"disk"`
	DiskBps      string            `json:"disk_bps"`
	DiskIOPS     int               `json:"disk_iops"`
	MaxConns     int               `json:"max_conns"`
	ConnRate     int               `json:"conn_rate"`
	DNSRate      int               `json:"dns_rate"`
	EgressBW     string            `json:"egress_bandwidth"`
	IngressBW    string            `json:"ingress_bandwidth"`
}

// sizes reads the size arguments of a create: the disk in MiB, and its I/O bound and the
// budgets in bytes per second, each a size such as 20g or plain MiB.
func (a createArgs) sizes() (diskMiB int, diskBps int64, l netapi.Limits, err error) {
	if a.Disk != "" {
		if diskMiB, err = bytesize.ParseMiB(a.Disk); err != nil {
			return 0, 0, l, errdefs.Invalid("disk: %v", err)
		}
	}
	l = netapi.Limits{MaxConns: a.MaxConns, ConnRate: a.ConnRate, DNSRate: a.DNSRate}
	for _, b := range []struct {
		key string
		in  string
		out *int64
	}{{"egress_bandwidth", a.EgressBW, &l.EgressBandwidth}, {"ingress_bandwidth", a.IngressBW, &l.IngressBandwidth}, {"disk_bps", a.DiskBps, &diskBps}} {
		if b.in == "" {
			continue
		}
		n, err := bytesize.Parse(b.in, bytesize.MiB)
		if err != nil || n <= 0 {
			return 0, 0, l, errdefs.Invalid("%s: %q is not a size per second: use a unit, as in 10m or 500k", b.key, b.in)
		}
		*b.out = n
	}
	return diskMiB, diskBps, l, nil
}

// labelPairs validates labels the way `nexus create -l` does, key by key: a key holding '='
// is refused, not split into another key and value.
func labelPairs(labels map[string]string) (map[string]string, error) {
	if len(labels) == 0 {
		return nil, nil
	}
	if err := api.ValidateLabels(labels); err != nil {
		return nil, err
	}
	return labels, nil
}

func (s *Server) sandboxCreate(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a createArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	name, err := api.FullName(a.Project, a.Name)
	if err != nil {
		return nil, err
	}
	labels, err := labelPairs(a.Labels)
	if err != nil {
		return nil, err
	}
	cfg, err := config.ForCreate(a.Config)
	if err != nil {
		return nil, err
	}
	diskMiB, diskBps, limits, err := a.sizes()
	if err != nil {
		return nil, err
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, api.CreateTimeout)
	defer cancel()
	sb, err := c.Create(cctx, s.adjustCreate(ctx, api.CreateRequest{Name: name, Image: a.Image, Labels: labels, MemoryMiB: a.Memory, VCPUs: a.VCPUs,
		Agent: a.Agent, EgressMode: a.Egress, AllowHosts: a.AllowedHosts, AllowPrivate: a.AllowPrivate, Secrets: a.Secrets, Repos: a.Repos, Config: cfg, TTL: a.TTL, IdleTimeout: a.IdleTimeout, NoStart: !a.Start, Cold: a.Cold,
		DiskMiB: diskMiB, DiskBps: diskBps, DiskIOPS: a.DiskIOPS, Limits: limits}))
	if sb != nil && a.RemoveOnExit {
		// The record exists (even a failed boot leaves one): remove it on exit either way.
		s.mu.Lock()
		s.onExit[sb.Name] = true
		s.mu.Unlock()
	}
	if err != nil {
		return nil, err
	}
	return sb, nil
}

type listArgs struct {
	All      *bool  `json:"all"`
	Selector string `json:"selector"`
}

// listResult is sandbox_list's result: MCP structured content is an object.
type listResult struct {
	Sandboxes []api.SandboxView `json:"sandboxes"`
}

func (s *Server) sandboxList(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a listArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	r := api.ListRequest{All: a.All == nil || *a.All}
	if a.Selector != "" {
		r.Selector = []string{a.Selector}
	}
	list, err := c.List(ctx, r)
	if err != nil {
		return nil, err
	}
	if list == nil {
		list = []api.SandboxView{}
	}
	return listResult{Sandboxes: list}, nil
}

type nameArgs struct {
	Name  string `json:"name"`
	Force *bool  `json:"force"`
}

func (s *Server) sandboxGet(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a nameArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Name == "" {
		return nil, errdefs.Invalid("name is required")
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	return c.Get(ctx, a.Name)
}

// applyResult is the outcome of a lifecycle verb on one sandbox.
type applyResult struct {
	Name  string `json:"name"`
	State string `json:"state"`
}

// applyVerb serves start, stop, pause, resume and remove: one named sandbox each.
func (s *Server) applyVerb(tool string) handlerFunc {
	verb := map[string]api.Lifecycle{
		ToolSandboxStart: api.Start, ToolSandboxStop: api.Stop, ToolSandboxPause: api.Pause,
		ToolSandboxResume: api.Resume, ToolSandboxRemove: api.Remove,
	}[tool]
	return func(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
		var a nameArgs
		if err := bind(req, &a); err != nil {
			return nil, err
		}
		if a.Name == "" {
			return nil, errdefs.Invalid("name is required")
		}
		force := a.Force != nil && *a.Force
		if tool == ToolSandboxRemove && a.Force == nil {
			force = true // an agent asking to remove a sandbox means it, running or not
		}
		c, err := s.client(ctx)
		if err != nil {
			return nil, err
		}
		actx, cancel := context.WithTimeout(ctx, api.CreateTimeout)
		defer cancel()
		res, err := c.Apply(actx, verb, api.NamesRequest{Names: []string{a.Name}, Force: force})
		if err != nil {
			return nil, err
		}
		if len(res) != 1 {
			return nil, fmt.Errorf("the gateway answered %d results for one sandbox", len(res))
		}
		r := res[0]
		if r.Error != "" {
			return nil, errdefs.FromCode(r.Code, r.Error)
		}
		state := string(r.State)
		if verb == api.Remove {
			state = "removed"
			s.mu.Lock()
			delete(s.onExit, r.Name)
			s.mu.Unlock()
		}
		return applyResult{Name: r.Name, State: state}, nil
	}
}
