package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/failpoint"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/pkg/profile"
)

// Limits and defaults of a sandbox.
const (
	DefaultImage     = api.DefaultImage
	DefaultMemoryMiB = 1024
	MinMemoryMiB     = 128 // below this the Debian kernel and the agent do not come up
	MaxMemoryMiB     = 256 << 10
	DefaultVCPUs     = 1
	MaxVCPUs         = 64
)

// ReconcileEvery is how often the registry is compared with what the vmm runs.
var ReconcileEvery = 15 * time.Second

// RecoveryWait bounds how long a starting gateway waits for the vmm to answer before it serves.
var RecoveryWait = 30 * time.Second

// Config configures the gateway.
type Config struct {
	Bus     *nats.Conn
	Home    home.Dir
	Host    string // the host new sandboxes are placed on
	Log     zerolog.Logger
	Version string
	// MetricsAddr, when set, is where /metrics is served (metrics.go); a bare :port is on
	// 127.0.0.1.
	MetricsAddr string
	// MinFreeDisk is the home's low free-space watermark: below it creates and forks are refused
	// with "host disk full"; zero admits always.
	MinFreeDisk home.Watermark
	// MCPEgress lets live egress changes come through MCP (nexus up --mcp-egress); off, the
	// gateway refuses them (egress_live.go).
	MCPEgress bool
}

// Service serves the gateway API on the bus.
type Service struct {
	cfg Config
	reg *Registry
	log zerolog.Logger
	// deleg holds the worktree delegations; nil without a home directory.
	deleg *delegations
	idle  *idleWatch
	// audit publishes the gateway's policy changes (egress_live.go); grantWake wakes the grant
	// expiry watcher.
	audit     *audit.Publisher
	grantWake chan struct{}
	// askers bounds the guest commands run at once to name the process of an egress request
	// (egress_requests.go); nil runs none.
	askers chan struct{}
	// booting ends, by sandbox id, the vmm call of a boot under way when its vmm reports that
	// VM failed (a vmm that restarted mid-boot never answers the call): *bootCall.
	booting sync.Map
}

// New returns a gateway; Run binds it to the bus.
func New(cfg Config) (*Service, error) {
	if cfg.Host == "" {
		cfg.Host = bus.LocalHost
	}
	return &Service{cfg: cfg, log: cfg.Log, idle: &idleWatch{last: map[string]idleSample{}}, grantWake: make(chan struct{}, 1), askers: make(chan struct{}, 2)}, nil
}

// Run registers the endpoints and serves until ctx ends.
func (g *Service) Run(ctx context.Context) error {
	reg, err := NewRegistry(ctx, g.cfg.Bus)
	if err != nil {
		return err
	}
	reg.home = string(g.cfg.Home)
	g.reg = reg
	if g.cfg.Home != "" {
		if g.deleg, err = openDelegations(g.cfg.Home, g.log); err != nil {
			return err
		}
	}
	sub, err := g.watchVMs(ctx)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if g.cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", g.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		go func() {
			if err := g.serveMetrics(ctx, ln); err != nil {
				g.log.Error().Err(err).Msg("metrics: cannot serve")
			}
		}()
	}
	// What a crash left half done is settled before the first request is answered.
	g.recoverOnStart(ctx, RecoveryWait)
	if g.cfg.Home != "" {
		pub, err := audit.NewSpooledPublisher(g.cfg.Bus, bus.UserGateway, g.log, g.cfg.Home.AuditSpool("gateway"))
		if err != nil {
			return err
		}
		defer pub.Close(context.Background())
		g.audit = pub
	}
	go g.watchLeases(ctx)
	go g.watchIdle(ctx)
	go g.watchHosts(ctx)
	go g.watchGrants(ctx)
	if err := g.watchRequests(ctx); err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(ReconcileEvery)
		defer t.Stop()
		for {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			g.reconcile(rctx)
			cancel()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	info := bus.ServiceInfo{Name: "gateway", Version: g.cfg.Version, Host: g.cfg.Host, Description: "sandbox registry and orchestration"}
	return bus.Serve(ctx, g.cfg.Bus, info, g.log, func(s *bus.Service) error {
		errs := []error{
			api.Create.Serve(s, g.create),
			api.Get.Serve(s, func(ctx context.Context, r api.NameRequest) (*api.Sandbox, error) {
				name, err := api.ParseName(r.Name)
				if err != nil {
					return nil, err
				}
				return g.reg.Get(ctx, name)
			}),
			api.List.Serve(s, g.list),
			api.Stats.Serve(s, g.stats),
			api.Start.Serve(s, g.apply(g.start)),
			api.Stop.Serve(s, g.apply(g.stop)),
			api.Pause.Serve(s, g.apply(g.pause)),
			api.Resume.Serve(s, g.apply(g.resume)),
			api.Remove.Serve(s, g.apply(g.remove)),
			api.Exec.Serve(s, g.exec),
			api.Copy.Serve(s, g.copy),
			api.Logs.Serve(s, g.logs),
			api.Images.Serve(s, g.images),
			api.SecretSet.Serve(s, g.secretSet),
			api.SecretList.Serve(s, g.secretList),
			api.SecretRemove.Serve(s, g.secretRemove),
			api.EgressShow.Serve(s, g.egressShow),
			api.EgressExplain.Serve(s, g.egressExplain),
			api.EgressAllow.Serve(s, g.egressAllow),
			api.EgressRevoke.Serve(s, g.egressRevoke),
			api.EgressDeny.Serve(s, g.egressDeny),
			api.EgressApply.Serve(s, g.egressApply),
			api.EgressRequests.Serve(s, g.egressRequests),
			api.EgressApprove.Serve(s, g.egressApprove),
			api.EgressReject.Serve(s, g.egressReject),
			api.EgressWhy.Serve(s, g.egressWhy),
			api.Image.Serve(s, g.image),
			api.Ports.Serve(s, g.ports),
			api.SnapshotCreate.Serve(s, g.snapshotCreate),
			api.SnapshotList.Serve(s, g.snapshotList),
			api.SnapshotRemove.Serve(s, g.snapshotRemove),
			api.Fork.Serve(s, g.fork),
			api.VolumeList.Serve(s, g.volumeList),
			api.VolumeRemove.Serve(s, g.volumeRemove),
			api.DelegateCreate.Serve(s, g.delegateCreate),
			api.DelegateDispatch.Serve(s, g.delegateDispatch),
			api.DelegatePoll.Serve(s, g.delegatePoll),
			api.DelegateTeardown.Serve(s, g.delegateTeardown),
		}
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	})
}

func (g *Service) vmm(host string) *vmmapi.Client { return vmmapi.NewClient(g.cfg.Bus, host) }
func (g *Service) cred() *credapi.Client          { return credapi.NewClient(g.cfg.Bus) }

// create validates the request, records the sandbox and boots it. A failed boot leaves the
// record in state failed with the reason, and no VM behind it.
func (g *Service) create(ctx context.Context, r api.CreateRequest) (*api.Sandbox, error) {
	sb, err := g.validate(ctx, r)
	if err != nil {
		return nil, err
	}
	if err := g.admit(); err != nil {
		return nil, err
	}
	if err := g.reg.Create(ctx, sb); err != nil {
		return nil, err
	}
	failpoint.Hit("gateway/create/recorded")
	if r.NoStart {
		return sb, nil
	}
	if err := g.bootNew(ctx, sb, r.Progress, r.Cold); err != nil {
		if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrRefused) {
			// The request itself was wrong (an unknown image, say) or asked for more than the
			// host can give: leave nothing behind.
			g.discard(ctx, sb)
		}
		return sb, err
	}
	return sb, nil
}

func (g *Service) validate(ctx context.Context, r api.CreateRequest) (*api.Sandbox, error) {
	name, err := api.ParseName(r.Name)
	if err != nil {
		return nil, err
	}
	if err := api.ValidateLabels(r.Labels); err != nil {
		return nil, err
	}
	sb := &api.Sandbox{ID: NewID(), Name: name, Labels: r.Labels, Image: r.Image, MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs, CPUs: r.CPUs, DiskMiB: r.DiskMiB,
		DiskBps: r.DiskBps, DiskIOPS: r.DiskIOPS, Agent: r.Agent, NoPortForward: r.NoPortForward, Ephemeral: r.Ephemeral, Host: g.cfg.Host}
	if sb.Image == "" {
		sb.Image = DefaultImage
	}
	switch {
	case sb.MemoryMiB == 0:
		sb.MemoryMiB = DefaultMemoryMiB
	case sb.MemoryMiB < MinMemoryMiB:
		return nil, errdefs.Invalid("--memory %d is below the guest's minimum of %d MiB", sb.MemoryMiB, MinMemoryMiB)
	case sb.MemoryMiB > MaxMemoryMiB:
		return nil, errdefs.Invalid("--memory %d is above the maximum of %d MiB", sb.MemoryMiB, MaxMemoryMiB)
	}
	switch {
	case sb.VCPUs == 0:
		sb.VCPUs = DefaultVCPUs
	case sb.VCPUs < 0 || sb.VCPUs > MaxVCPUs:
		return nil, errdefs.Invalid("--vcpus %d is out of range 1-%d", sb.VCPUs, MaxVCPUs)
	}
	switch {
	case sb.DiskMiB < 0 || sb.DiskMiB > api.MaxDiskMiB:
		return nil, errdefs.Invalid("--disk %d MiB is out of range: at most %d MiB (%d TiB)", sb.DiskMiB, api.MaxDiskMiB, api.MaxDiskMiB>>20)
	}
	if sb.DiskBps != 0 && (sb.DiskBps < api.MinDiskBps || sb.DiskBps > api.MaxDiskBps) {
		return nil, errdefs.Invalid("--disk-bps %d is out of range: %d KiB to %d GiB per second", sb.DiskBps, api.MinDiskBps>>10, api.MaxDiskBps>>30)
	}
	if sb.DiskIOPS != 0 && (sb.DiskIOPS < api.MinDiskIOPS || sb.DiskIOPS > api.MaxDiskIOPS) {
		return nil, errdefs.Invalid("--disk-iops %d is out of range %d-%d", sb.DiskIOPS, api.MinDiskIOPS, api.MaxDiskIOPS)
	}
	if sb.CPUs < 0 || sb.CPUs > MaxVCPUs || (sb.CPUs > 0 && sb.CPUs < 0.01) {
		return nil, errdefs.Invalid("--cpus %g is out of range 0.01-%d", sb.CPUs, MaxVCPUs)
	}
	if r.IdleTimeout != "" {
		if _, err := api.ParseLifetime("idle-timeout", r.IdleTimeout); err != nil {
			return nil, err
		}
		sb.IdleTimeout = r.IdleTimeout
	}
	if r.TTL != "" {
		ttl, err := api.ParseTTL(r.TTL)
		if err != nil {
			return nil, err
		}
		sb.ExpiresAt = time.Now().Add(ttl).UTC().Truncate(time.Second)
	}
	if sb.Agent == "" {
		sb.Agent = profile.DefaultName
	}
	prof, err := profile.Get(sb.Agent)
	if err != nil {
		return nil, err
	}
	mounts, err := parseMounts(r.Mounts)
	if err != nil {
		return nil, err
	}
	sb.Mounts = mounts
	if sb.Volumes, err = parseNamedMounts(r.MountNamed); err != nil {
		return nil, err
	}
	plan, err := planEgress(r, prof, time.Now(), g.storedSecrets(ctx))
	if err != nil {
		return nil, err
	}
	sb.Egress, sb.Secrets, sb.Config = plan.egress, plan.secrets, plan.config
	if err := g.place(ctx, sb, r, prof); err != nil {
		return nil, err
	}
	return sb, nil
}

func parseMounts(specs []string) ([]api.Mount, error) {
	var out []api.Mount
	for _, s := range specs {
		parts := strings.Split(s, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") || !strings.HasPrefix(parts[0], "/") {
			return nil, errdefs.Invalid("invalid --mount %q: use /host/path:/guest/path[:ro]", s)
		}
		m := api.Mount{Host: parts[0], Guest: parts[1]}
		if len(parts) == 3 {
			if parts[2] != "ro" {
				return nil, errdefs.Invalid("invalid --mount %q: the only option is ro", s)
			}
			m.ReadOnly = true
		}
		out = append(out, m)
	}
	return out, nil
}

// startBoot moves sb to starting and sets up its egress perimeter: the steps every boot of a
// sandbox shares, cold or forked. On failure the sandbox is failed and nothing is left set up.
func (g *Service) startBoot(ctx context.Context, sb *api.Sandbox) (*perimeter, error) {
	if err := g.reg.Transition(ctx, sb, api.StateStarting, "", nil); err != nil {
		if cur, gerr := g.reg.Get(ctx, sb.Name); errors.Is(err, errdefs.ErrConflict) && gerr == nil && cur.ID == sb.ID && cur.State == api.StateStarting {
			return nil, errAlreadyStarting(sb.Name) // a start that raced this one won
		}
		return nil, err
	}
	failpoint.Hit("gateway/boot/starting")
	prof, err := profile.Get(sb.Agent)
	if err != nil {
		g.fail(sb, err)
		return nil, err
	}
	plan, err := planFromRecord(sb)
	if err != nil {
		g.fail(sb, err)
		return nil, err
	}
	perim, err := g.setupPerimeter(ctx, sb, prof, plan)
	if err != nil {
		err = fmt.Errorf("egress perimeter: %w", err)
		g.teardownPerimeter(context.WithoutCancel(ctx), sb)
		g.fail(sb, err)
		return nil, err
	}
	failpoint.Hit("gateway/boot/perimeter")
	return perim, nil
}

// whileBooting runs call, the vmm call of a boot of sandbox id, and ends it with the reason
// when the vmm reports the VM failed meanwhile (watchVMs).
func (g *Service) whileBooting(ctx context.Context, id string, call func(context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	b := &bootCall{cancel: cancel}
	g.booting.Store(id, b)
	defer g.booting.CompareAndDelete(id, b)
	err := call(ctx)
	if err != nil && ctx.Err() != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, ctx.Err()) {
			return cause
		}
	}
	return err
}

// bootCall is a boot's vmm call under way, in Service.booting.
type bootCall struct{ cancel context.CancelCauseFunc }

// errAlreadyStarting refuses a start of a sandbox that another start (or its create) is booting.
func errAlreadyStarting(name string) error {
	return errdefs.Conflict("sandbox %s is already starting: another start is under way; wait for it to finish (nexus ps)", name)
}

// boot moves sb through starting to running, or to failed with the reason.
func (g *Service) boot(ctx context.Context, sb *api.Sandbox, progress string) error {
	return g.bootNew(ctx, sb, progress, false)
}

// bootNew is boot; a new sandbox's VM is restored from its shape's template unless cold.
func (g *Service) bootNew(ctx context.Context, sb *api.Sandbox, progress string, cold bool) (err error) {
	defer func() {
		if err != nil {
			err = g.removedMeanwhile(sb, err)
		}
	}()
	perim, err := g.startBoot(ctx, sb)
	if err != nil {
		return err
	}
	req := vmmapi.StartRequest{ID: sb.ID, Name: sb.Name, Image: sb.Image, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs, CPUs: sb.CPUs, DiskMiB: sb.DiskMiB,
		DiskBps: sb.DiskBps, DiskIOPS: sb.DiskIOPS, Hostname: hostname(sb.Name), Progress: progress, NoPortForward: sb.NoPortForward,
		NetSocket: perim.netSocket, Env: perim.env, TrustCA: perim.trustCA, Cold: cold}
	for _, m := range sb.Mounts {
		req.Mounts = append(req.Mounts, vmmapi.Mount{Host: m.Host, Guest: m.Guest, ReadOnly: m.ReadOnly})
	}
	req.Mounts = append(req.Mounts, perim.mounts...)
	req.Volumes = vmmVolumes(sb.Volumes)
	if err := g.whileBooting(ctx, sb.ID, func(ctx context.Context) error {
		_, err := g.vmm(sb.Host).Start(ctx, req)
		return err
	}); err != nil {
		if errors.As(err, new(errHostLost)) {
			return err // failed already; settled when the host is back (checkHosts)
		}
		g.teardownPerimeter(context.WithoutCancel(ctx), sb)
		g.fail(sb, err)
		return err
	}
	failpoint.Hit("gateway/boot/vm")
	return g.reg.Transition(ctx, sb, api.StateRunning, "", nil)
}

// removedMeanwhile explains a boot that failed because the sandbox was removed (or is being
// removed) while it started: the caller would otherwise see the lost revision race.
func (g *Service) removedMeanwhile(sb *api.Sandbox, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cur, gerr := g.reg.Get(ctx, sb.Name)
	if errors.Is(gerr, errdefs.ErrNotFound) || (gerr == nil && (cur.ID != sb.ID || cur.State == api.StateRemoving)) {
		return errdefs.Conflict("sandbox %s was removed while it was starting", sb.Name)
	}
	return err
}

// admit refuses a new sandbox while the home's filesystem is below its free-space watermark
// ("host disk full: …"); running sandboxes are left alone (the vmm publishes the low-space event).
func (g *Service) admit() error { return g.cfg.Home.CheckSpace(g.cfg.MinFreeDisk) }

// forget deletes the record of a sandbox whose creation was refused.
func (g *Service) forget(sb *api.Sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cur, err := g.reg.Get(ctx, sb.Name); err == nil && cur.ID == sb.ID {
		g.reg.Delete(ctx, cur)
	}
}

// fail records why a sandbox failed; it uses its own deadline because ctx may be what ended.
func (g *Service) fail(sb *api.Sandbox, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		cur, err := g.reg.Get(ctx, sb.Name)
		if err != nil {
			return
		}
		if failedForHostLoss(cur) {
			// What a call to a lost host says is not news, and the reason settles it when
			// the host is back.
			*sb = *cur
			return
		}
		if err := g.reg.Transition(ctx, cur, api.StateFailed, cause.Error(), nil); err == nil {
			*sb = *cur
			return
		}
	}
}

func hostname(name string) string {
	_, n, _ := strings.Cut(name, "/")
	return n
}

// eachHost calls ask once for each host the sandboxes are on, with a deadline of statsWait.
func eachHost(ctx context.Context, sandboxes []*api.Sandbox, ask func(ctx context.Context, host string)) {
	asked := map[string]bool{}
	for _, sb := range sandboxes {
		if asked[sb.Host] {
			continue
		}
		asked[sb.Host] = true
		hctx, cancel := context.WithTimeout(ctx, statsWait)
		ask(hctx, sb.Host)
		cancel()
	}
}

// vmInfos asks the vmm of each host the sandboxes are on for what it runs, by sandbox id; a
// host that does not answer within statsWait is left out.
func (g *Service) vmInfos(ctx context.Context, sandboxes []*api.Sandbox) map[string]vmmapi.VMInfo {
	vms := map[string]vmmapi.VMInfo{}
	eachHost(ctx, sandboxes, func(ctx context.Context, host string) {
		if list, err := g.vmm(host).List(ctx); err == nil {
			for _, vi := range list {
				vms[vi.ID] = vi
			}
		}
	})
	return vms
}

func (g *Service) list(ctx context.Context, r api.ListRequest) (api.SandboxPage, error) {
	sel, err := api.ParseSelector(r.Selector...)
	if err != nil {
		return nil, err
	}
	limit := r.Limit
	if limit <= 0 || limit > api.ListPage {
		limit = api.ListPage
	}
	// One page: the first limit sandboxes named after r.After, read only (each becomes a view).
	page, err := g.reg.page(ctx, sel, r.After, limit, func(sb *api.Sandbox) bool {
		return r.All || (sb.State != api.StateStopped && sb.State != api.StateFailed)
	})
	if err != nil {
		return nil, err
	}
	if r.MaxBytes > 0 {
		page = cutToBytes(page, min(r.MaxBytes, api.ListPageBytes))
	}
	sandboxes := make([]*api.Sandbox, len(page))
	for i, l := range page {
		sandboxes[i] = l.sb
	}
	// What each host's vmm measures (resident memory); a host that does not answer just
	// leaves the column empty.
	vms := g.vmInfos(ctx, sandboxes)
	out := make(api.SandboxPage, len(page))
	ids := make([]string, len(page))
	for i, l := range page {
		out[i] = api.SandboxView{Sandbox: *l.sb, RSSBytes: vms[l.sb.ID].RSSBytes, Containment: vms[l.sb.ID].Containment}
		out[i].UseEncoded(l.enc)
		ids[i] = l.sb.ID
	}
	limited := g.auditLimits(ctx, ids...)
	for i := range out {
		out[i].AuditLimited = limited[out[i].ID]
	}
	return out, nil
}

// viewExtra bounds what a view adds to its record's JSON (rss_bytes, audit_limited, containment).
const viewExtra = 512

// cutToBytes is the start of page whose JSON stays within max bytes, at least one record.
func cutToBytes(page []listed, max int) []listed {
	size := 2 // [ ]
	for i, l := range page {
		n := len(l.enc)
		if n == 0 { // read from the bucket, not the cache: measured now
			b, _ := json.Marshal(l.sb)
			n = len(b)
		}
		size += n + viewExtra + 1
		if size > max && i > 0 {
			return page[:i]
		}
	}
	return page
}

// apply runs one verb on each named (or selected) sandbox and reports each outcome.
func (g *Service) apply(fn func(ctx context.Context, sb *api.Sandbox, force bool) error) func(context.Context, api.NamesRequest) ([]api.Result, error) {
	return func(ctx context.Context, r api.NamesRequest) ([]api.Result, error) {
		if len(r.Names) > 0 && len(r.Selector) > 0 {
			return nil, errdefs.Invalid("name sandboxes or select them with -l, not both")
		}
		var targets []*api.Sandbox
		var results []api.Result
		if len(r.Selector) > 0 {
			sel, err := api.ParseSelector(r.Selector...)
			if err != nil {
				return nil, err
			}
			if targets, err = g.reg.List(ctx, sel); err != nil {
				return nil, err
			}
		} else if len(r.Names) == 0 {
			return nil, errdefs.Invalid("name at least one sandbox, or select with -l key=value")
		}
		for _, n := range r.Names {
			name, err := api.ParseName(n)
			if err == nil {
				var sb *api.Sandbox
				if sb, err = g.reg.Get(ctx, name); err == nil {
					targets = append(targets, sb)
					continue
				}
			}
			results = append(results, api.Result{Name: n, Error: err.Error(), Code: errdefs.Code(err)})
		}
		for _, sb := range targets {
			res := api.Result{Name: sb.Name}
			if err := fn(ctx, sb, r.Force); err != nil {
				res.Error, res.Code = err.Error(), errdefs.Code(err)
			}
			res.State = sb.State
			results = append(results, res)
		}
		return results, nil
	}
}

func (g *Service) start(ctx context.Context, sb *api.Sandbox, _ bool) error {
	switch sb.State {
	case api.StateRunning:
		return nil
	case api.StatePaused:
		return g.resume(ctx, sb, false)
	case api.StateStarting:
		return errAlreadyStarting(sb.Name)
	}
	if g.isHostLost(ctx, sb.Host) {
		return errdefs.Unavailable("sandbox %s is on host %s, which is lost: start it once the host is back (nexus hosts), or nexus rm it", sb.Name, sb.Host)
	}
	if sb.Fork != "" {
		// A fork whose restore a crash or a failure cut off: restored again, not cold-booted.
		if err := g.bootFork(ctx, sb, sb.Fork, ""); err != nil {
			return g.removedMeanwhile(sb, err)
		}
		return nil
	}
	return g.boot(ctx, sb, "")
}

func (g *Service) stop(ctx context.Context, sb *api.Sandbox, force bool) error {
	switch sb.State {
	case api.StateStopped, api.StateCreated:
		return nil
	}
	if sb.State != api.StateStopping {
		if err := g.reg.Transition(ctx, sb, api.StateStopping, "", nil); err != nil {
			return err
		}
	}
	failpoint.Hit("gateway/stop/stopping")
	if err := g.vmm(sb.Host).Stop(ctx, sb.ID, force); err != nil {
		g.fail(sb, fmt.Errorf("stop: %w", err))
		return err
	}
	failpoint.Hit("gateway/stop/vm")
	if err := g.teardownPerimeter(ctx, sb); err != nil {
		g.log.Warn().Err(err).Str("sandbox", sb.Name).Msg("perimeter teardown incomplete")
	}
	failpoint.Hit("gateway/stop/perimeter")
	return g.reg.Transition(ctx, sb, api.StateStopped, "", nil)
}

func (g *Service) pause(ctx context.Context, sb *api.Sandbox, _ bool) error {
	if sb.State == api.StatePaused {
		return nil
	}
	if sb.State != api.StateRunning {
		return errdefs.Conflict("sandbox %s is %s; only a running sandbox can be paused", sb.Name, sb.State)
	}
	if err := g.vmm(sb.Host).Pause(ctx, sb.ID); err != nil {
		return err
	}
	failpoint.Hit("gateway/pause/vm")
	return g.reg.Transition(ctx, sb, api.StatePaused, "", nil)
}

func (g *Service) resume(ctx context.Context, sb *api.Sandbox, _ bool) error {
	if sb.State == api.StateRunning {
		return nil
	}
	if sb.State != api.StatePaused {
		return errdefs.Conflict("sandbox %s is %s; only a paused sandbox can be resumed", sb.Name, sb.State)
	}
	if err := g.vmm(sb.Host).Resume(ctx, sb.ID); err != nil {
		return err
	}
	failpoint.Hit("gateway/resume/vm")
	return g.reg.Transition(ctx, sb, api.StateRunning, "", nil)
}

// removeBecause removes sb (force) on nexus's own initiative: the removing transition carries
// why on the event stream.
func (g *Service) removeBecause(ctx context.Context, sb *api.Sandbox, why string) error {
	if sb.State != api.StateRemoving {
		if err := g.reg.Transition(ctx, sb, api.StateRemoving, why, nil); err != nil {
			return err
		}
	}
	return g.remove(ctx, sb, true)
}

// remove tears down everything of a sandbox, then its record. A running sandbox needs force.
func (g *Service) remove(ctx context.Context, sb *api.Sandbox, force bool) error {
	switch sb.State {
	case api.StateRunning, api.StatePaused, api.StateStarting:
		if !force {
			return errdefs.Conflict("sandbox %s is %s: stop it first, or use rm --force", sb.Name, sb.State)
		}
	}
	if g.isHostLost(ctx, sb.Host) {
		return g.removeOnLostHost(ctx, sb)
	}
	if sb.State != api.StateRemoving {
		if err := g.reg.Transition(ctx, sb, api.StateRemoving, "", nil); err != nil {
			return err
		}
	}
	failpoint.Hit("gateway/remove/removing")
	if err := g.vmm(sb.Host).Remove(ctx, sb.ID); err != nil {
		if g.isHostLost(ctx, sb.Host) { // lost while it was asked
			return g.removeOnLostHost(ctx, sb)
		}
		return fmt.Errorf("remove %s: %w", sb.Name, err)
	}
	failpoint.Hit("gateway/remove/vm")
	if err := g.teardownPerimeter(ctx, sb); err != nil {
		return fmt.Errorf("remove %s: %w", sb.Name, err)
	}
	failpoint.Hit("gateway/remove/perimeter")
	return g.reg.Delete(ctx, sb)
}
