// Package vmm is the VM service: it boots one QEMU microVM per sandbox from a root image, a
// Debian kernel and an initramfs whose /init is the guest agent, keeps a channel to that agent,
// and serves lifecycle, exec, copy and logs on nexus.vmm.<host>.<verb>. QEMU processes outlive
// the service: a restarted vmm adopts them again from their pidfiles and QMP sockets.
package vmm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/guest"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

// Config configures the vmm service.
type Config struct {
	Bus     *nats.Conn
	Home    home.Dir
	Host    string
	Log     zerolog.Logger
	Version string
	// AgentPath is the static guest agent binary; default nexus-agent beside this executable.
	AgentPath string
	// Driver runs the VMs; default QEMU, configured by QEMU.
	Driver Driver
	QEMU   qemu.Config
	// CacheDir holds downloads (kernel, busybox, debootstrap debs) and built images' copies;
	// default $NEXUS_HOME/cache. Many homes (tests, CI) may share one.
	CacheDir string
	// BootTimeout bounds a boot until the agent answers; default 120s (TCG is slow).
	BootTimeout time.Duration
	// Heartbeat is how often the agent is pinged; three missed answers mark the guest hung.
	Heartbeat time.Duration
	// Admission bounds what the sandboxes of this host may ask for together.
	Admission Admission
	// MinFreeDisk is the home's low free-space watermark (disk.go); zero: not watched.
	MinFreeDisk home.Watermark
	// Labels are this host's placement labels (--host-label), in its heartbeat.
	Labels map[string]string
	// NoTemplates boots every sandbox cold and builds no template (template.go).
	NoTemplates bool
	// BuildCacheBytes bounds the Dockerfile build cache's layers (0: image.DefaultBuildCacheBytes).
	BuildCacheBytes int64
}

// Service runs the VMs of one host.
type Service struct {
	cfg Config
	log zerolog.Logger
	drv Driver

	bootMu sync.Mutex // serialises kernel and initramfs preparation
	boot   *bootFiles

	mu       sync.Mutex
	vms      map[string]*machine
	reserved map[string]int // id → MiB admitted for a boot under way (admission.go)
	idLocks  sync.Map       // sandbox id → *sync.Mutex, see lockID
	// adopting holds a channel per VM an earlier vmm left running, closed once this vmm has
	// adopted it (or given up): requests about it wait for that (awaitAdoption).
	adopting map[string]chan struct{}
	// failed says why a VM this vmm found at start is gone (adoption), until it starts again.
	failed map[string]string

	snapMu   sync.RWMutex // forks hold it shared, snapshot rm exclusively (snapshot.go)
	snapping sync.Map     // ids of sandboxes being snapshotted (snapshot.go)
	tpl      templates    // template builds (template.go)
}

// New checks QEMU and the agent binary; Run serves.
func New(cfg Config) (*Service, error) {
	if cfg.Host == "" {
		cfg.Host = bus.LocalHost
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = cfg.Home.Cache()
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 120 * time.Second
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 5 * time.Second
	}
	cfg.Admission = cfg.Admission.withDefaults()
	if cfg.AgentPath == "" {
		exe, err := os.Executable()
		if err == nil {
			cfg.AgentPath = filepath.Join(filepath.Dir(exe), "nexus-agent")
		}
	}
	if _, err := os.Stat(cfg.AgentPath); err != nil {
		return nil, errdefs.Unavailable("vmm: the guest agent %s is missing: build it with `make build`", cfg.AgentPath)
	}
	if cfg.Driver == nil {
		if cfg.QEMU.CacheDir == "" {
			cfg.QEMU.CacheDir = cfg.CacheDir
		}
		cfg.QEMU.Logger = cfg.Log
		drv, err := qemu.New(cfg.QEMU)
		if err != nil {
			return nil, err
		}
		cfg.Driver = drv
	}
	return &Service{cfg: cfg, log: cfg.Log, drv: cfg.Driver, vms: map[string]*machine{}, reserved: map[string]int{},
		adopting: map[string]chan struct{}{}, failed: map[string]string{}}, nil
}

// Run adopts the VMs left running by an earlier vmm while it registers the endpoints, and
// serves.
func (s *Service) Run(ctx context.Context) error {
	s.adoptAll(ctx)
	s.cleanSnapshotTemps()
	s.cleanTemplateTemps()
	s.tpl.ctx = ctx
	defer s.tpl.wg.Wait() // a template build under way kills its VM when ctx ends
	go s.watchDisk(ctx)
	go s.heartbeat(ctx)
	info := bus.ServiceInfo{Name: "vmm", Version: s.cfg.Version, Host: s.cfg.Host, Description: "microVMs, images, guest agent channel"}
	return bus.Serve(ctx, s.cfg.Bus, info, s.log, func(svc *bus.Service) error {
		for _, err := range []error{
			api.Start.Serve(svc, s.start),
			api.Stop.Serve(svc, s.stop),
			api.Pause.Serve(svc, s.pause),
			api.Resume.Serve(svc, s.resume),
			api.Remove.Serve(svc, s.remove),
			api.Inspect.Serve(svc, s.inspect),
			api.List.Serve(svc, s.list),
			api.Exec.Serve(svc, s.exec),
			api.Copy.Serve(svc, s.copy),
			api.Logs.Serve(svc, s.logs),
			api.Images.Serve(svc, s.images),
			api.Image.Serve(svc, s.image),
			api.SnapshotCreate.Serve(svc, s.snapshotCreate),
			api.SnapshotRemove.Serve(svc, s.snapshotRemove),
			api.SnapshotChildren.Serve(svc, s.snapshotChildren),
			api.SnapshotList.Serve(svc, s.snapshotList),
			api.Fork.Serve(svc, s.fork),
			api.VolumeList.Serve(svc, s.volumes),
			api.VolumeRemove.Serve(svc, s.volumeRemove),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// machine is one running VM and the channel to its agent.
type machine struct {
	id, name string
	dir      string
	vm       hypervisor.VM
	// agent is nil while a VM adopted paused has not been resumed (its guest cannot answer);
	// it is set, under Service.mu, once and before awake is closed.
	agent    *guest.Client
	awake    chan struct{}      // closed when agent is set (adoptPaused, wake)
	ctx      context.Context    // lives as long as the machine is served
	cancel   context.CancelFunc // ends the hybrid-vsock server and the watcher
	stopping bool               // a stop or remove is under way: exits are expected
	execs    atomic.Int32       // commands running in the guest (exec.go)
	// cpuBusy and cpuTotal are the guest's CPU ticks from its last heartbeat (agentproto.Pong).
	cpuBusy, cpuTotal atomic.Uint64
	// memUsed is the guest's memory in use at its last heartbeat, in bytes.
	memUsed atomic.Uint64
}

// get returns the machine of id with its agent: a VM being adopted is waited for, and one
// adopted paused must be resumed first.
func (s *Service) get(id string) (*machine, error) {
	m, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.agent == nil {
		return nil, errdefs.Conflict("sandbox %s is paused: resume it first", id)
	}
	return m, nil
}

// lookup returns the machine of id, its agent or not, once any adoption of it has finished.
func (s *Service) lookup(id string) (*machine, error) {
	s.awaitAdoption(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.vms[id]
	if !ok {
		return nil, errdefs.Conflict("sandbox %s has no running VM", id)
	}
	return m, nil
}

// awaitAdoption waits until the VM of id, if an earlier vmm left one, is adopted or given up.
// Adoption is bounded (the agent gets 15 s), so this is too.
func (s *Service) awaitAdoption(id string) {
	s.mu.Lock()
	ch := s.adopting[id]
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// awaitAdoptions waits until every adoption has finished.
func (s *Service) awaitAdoptions() {
	s.mu.Lock()
	var chs []chan struct{}
	for _, ch := range s.adopting {
		chs = append(chs, ch)
	}
	s.mu.Unlock()
	for _, ch := range chs {
		<-ch
	}
}

// watch marks a VM failed when QEMU exits, the agent channel breaks, or the agent stops
// answering heartbeats, unless a stop asked for it.
func (s *Service) watch(ctx context.Context, m *machine) {
	t := time.NewTicker(s.cfg.Heartbeat)
	defer t.Stop()
	missed := 0
	var reason string
loop:
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.vm.Done():
			reason = s.whyFailed(m, "the VM exited unexpectedly (see nexus logs)")
			break loop
		case <-m.agent.Done():
			reason = s.whyFailed(m, "the guest agent channel closed unexpectedly (did the guest crash? see nexus logs)")
			break loop
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, 2*s.cfg.Heartbeat)
			pong, err := m.agent.Ping(pctx)
			cancel()
			if err == nil {
				missed = 0
				m.cpuBusy.Store(pong.CPUBusy)
				m.cpuTotal.Store(pong.CPUTotal)
				m.memUsed.Store(pong.MemUsed)
				continue
			}
			if ctx.Err() != nil {
				return
			}
			if paused, qerr := m.vm.Paused(ctx); qerr == nil && paused {
				missed = 0 // a paused guest cannot answer
				continue
			}
			if missed++; missed >= 3 {
				reason = s.whyFailed(m, "the guest stopped answering heartbeats (hung or panicked; see nexus logs)")
				break loop
			}
		}
	}
	s.lost(m, reason)
}

// lost ends a machine that failed on its own (unless a stop asked for it): it kills what is left
// of the VM, releases the host side and reports the reason.
func (s *Service) lost(m *machine, reason string) {
	s.mu.Lock()
	expected := m.stopping || s.vms[m.id] != m // a stop asked for it, or it was ended already
	if !expected {
		delete(s.vms, m.id)
	}
	s.mu.Unlock()
	if expected {
		return
	}
	s.log.Warn().Str("sandbox", m.name).Str("reason", reason).Msg("vm failed")
	m.vm.Kill()
	m.teardown()
	s.reportFailed(m.id, reason)
}

// teardown releases the host side of a machine; the disk overlay stays.
func (m *machine) teardown() {
	if m.cancel != nil {
		m.cancel()
	}
	if m.agent != nil {
		m.agent.Close()
	}
	m.vm.Cleanup()
	m.vm.Close()
	for _, p := range []string{"vsock.sock", "agent.sock", "qmp.sock", "net.sock"} {
		os.Remove(filepath.Join(m.dir, p))
	}
	matches, _ := filepath.Glob(filepath.Join(m.dir, "vsock.sock_*"))
	for _, p := range matches {
		os.Remove(p)
	}
}

func (s *Service) inspect(ctx context.Context, r api.IDRequest) (api.VMInfo, error) {
	s.awaitAdoption(r.ID)
	s.mu.Lock()
	m, ok := s.vms[r.ID]
	failed := s.failed[r.ID]
	s.mu.Unlock()
	if !ok {
		return api.VMInfo{ID: r.ID, Failed: failed}, nil
	}
	return s.info(ctx, m), nil
}

func (s *Service) info(ctx context.Context, m *machine) api.VMInfo {
	vi := api.VMInfo{ID: m.id, Running: !m.vm.Exited(), PID: m.vm.Pid(), Started: m.vm.Started(), RSSBytes: rss(m.vm.Pid()),
		CPUSeconds: cpuSeconds(m.vm.Pid()), Execs: int(m.execs.Load()),
		GuestCPUBusy: m.cpuBusy.Load(), GuestCPUTotal: m.cpuTotal.Load(), GuestMemUsedBytes: int64(m.memUsed.Load())}
	vi.DiskUsedBytes, vi.DiskSizeBytes = diskUsage(m.vm.Spec().Disk)
	if paused, err := m.vm.Paused(ctx); err == nil && paused {
		vi.Paused = true
	}
	if h, ok := m.vm.(hypervisor.Health); ok {
		vi.Containment, vi.DiskErrors = h.Containment(), h.DiskErrors().Count
	}
	return vi
}

func (s *Service) list(ctx context.Context, _ api.Empty) ([]api.VMInfo, error) {
	s.awaitAdoptions()
	s.mu.Lock()
	ms := make([]*machine, 0, len(s.vms))
	for _, m := range s.vms {
		ms = append(ms, m)
	}
	s.mu.Unlock()
	out := make([]api.VMInfo, 0, len(ms))
	for _, m := range ms {
		out = append(out, s.info(ctx, m))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// rss reads a process's resident set size from /proc.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0
	}
	var size, res int64
	fmt.Sscanf(string(b), "%d %d", &size, &res)
	return res * int64(os.Getpagesize())
}
