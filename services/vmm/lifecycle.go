package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/agentproto"
	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/guest"
	"github.com/IniZio/nexus/services/vmm/image"
	"github.com/IniZio/nexus/services/vmm/initramfs"
	"github.com/IniZio/nexus/services/vmm/kernel"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

// bootFiles are the kernel and initramfs every guest boots.
type bootFiles struct {
	kernel *kernel.Kernel
	initrd string
}

// steps reports named boot steps to a progress subject as they finish, and keeps them.
type steps struct {
	s       *Service
	subject string
	last    time.Time
	done    []api.Step
}

func (p *steps) finish(name string) {
	now := time.Now()
	st := api.Step{Name: name, Millis: now.Sub(p.last).Milliseconds(), Done: true}
	p.last = now
	p.done = append(p.done, st)
	if p.subject != "" {
		b, _ := json.Marshal(st)
		p.s.cfg.Bus.Publish(p.subject, b)
	}
}

// wrap names the step in an error, so a failed boot says where it stopped.
func wrap(step string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrConflict) {
		return err
	}
	return fmt.Errorf("boot step %s: %w", step, err)
}

// prepare fetches the kernel and builds the initramfs once per service lifetime (both are
// cached on disk by their inputs, so this is quick after the first time).
func (s *Service) prepare(ctx context.Context, p *steps) (*bootFiles, error) {
	s.bootMu.Lock()
	defer s.bootMu.Unlock()
	if s.boot != nil {
		return s.boot, nil
	}
	k, err := kernel.Ensure(ctx, s.cfg.CacheDir, nil)
	if err != nil {
		return nil, wrap("kernel", err)
	}
	p.finish("kernel")
	initrd, err := initramfs.Build(k, s.cfg.AgentPath, initramfs.DefaultModules, filepath.Join(s.cfg.CacheDir, "initramfs"))
	if err != nil {
		return nil, wrap("initramfs", err)
	}
	p.finish("initramfs")
	s.boot = &bootFiles{kernel: k, initrd: initrd}
	return s.boot, nil
}

// start boots the VM of a sandbox and returns once its agent answered and is configured.
// A stopped sandbox boots again on the disk it had.
func (s *Service) start(ctx context.Context, r api.StartRequest) (api.StartResponse, error) {
	// A stop or remove that arrives while this boot runs waits for it, then undoes it: no VM
	// can be left running behind a record that is gone.
	defer s.lockID(r.ID)()
	s.mu.Lock()
	if _, ok := s.vms[r.ID]; ok {
		s.mu.Unlock()
		return api.StartResponse{}, errdefs.Conflict("sandbox %s is already running", r.Name)
	}
	s.mu.Unlock()
	p := &steps{s: s, subject: r.Progress, last: time.Now()}
	bf, err := s.prepare(ctx, p)
	if err != nil {
		return api.StartResponse{}, err
	}
	base, err := s.ensureImage(ctx, r.Image, r.Progress)
	if err != nil {
		return api.StartResponse{}, wrap("image", err)
	}
	p.finish("image")
	dir := s.cfg.Home.Sandbox(r.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return api.StartResponse{}, wrap("disk", err)
	}
	if err := setPortForward(dir, !r.NoPortForward); err != nil {
		return api.StartResponse{}, wrap("disk", err)
	}
	disk := filepath.Join(dir, "disk.qcow2")
	if _, err := os.Stat(disk); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(filepath.Join(dir, imageFile), []byte(r.Image+"\n"), 0o600); err != nil {
			return api.StartResponse{}, wrap("disk", err)
		}
		if err := image.NewOverlay(base, disk); err != nil {
			return api.StartResponse{}, wrap("disk", err)
		}
	}
	p.finish("disk")
	spec := qemu.VMSpec{
		ID: r.ID, Dir: dir, Kernel: bf.kernel.VmlinuxPath, KernelVersion: bf.kernel.Version, Initrd: bf.initrd,
		Hostname: r.Hostname, MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs, Disk: disk, NetSocket: r.NetSocket,
	}
	if spec.Kernel == "" {
		spec.Kernel = bf.kernel.VmlinuzPath
	}
	if r.NetSocket != "" {
		spec.Net = &qemu.GuestNet{IP: "192.168.127.2/24", Gateway: "192.168.127.1", DNS: "192.168.127.1"}
	}
	for i, m := range r.Mounts {
		spec.Mounts = append(spec.Mounts, qemu.Mount{HostPath: m.Host, Tag: qemu.MountTag(i), ReadOnly: m.ReadOnly,
			Guest: m.Guest, Remount: m.Remount})
	}
	if err := s.attachVolumes(ctx, r.ID, r.Volumes, &spec); err != nil {
		return api.StartResponse{}, wrap("volumes", err)
	}
	vm, err := s.drv.Start(ctx, spec)
	if err != nil {
		return api.StartResponse{}, wrap("qemu", err)
	}
	p.finish("qemu")
	m := &machine{id: r.ID, name: r.Name, dir: dir, vm: vm}
	fail := func(step string, err error) (api.StartResponse, error) {
		m.stopping = true
		vm.Kill()
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		vm.Wait(wctx)
		cancel()
		m.teardown()
		return api.StartResponse{}, wrap(step, err)
	}
	bctx, cancel := context.WithTimeout(ctx, s.cfg.BootTimeout)
	defer cancel()
	agent, err := s.dialAgent(bctx, m)
	if err != nil {
		return fail("agent", err)
	}
	m.agent = agent
	if errs := agent.Agent().BootErrors; len(errs) > 0 {
		return fail("agent", fmt.Errorf("the guest did not boot cleanly: %s", strings.Join(errs, "; ")))
	}
	p.finish("agent")
	cfg := agentproto.ConfigureRequest{Hostname: r.Hostname, Env: r.Env}
	now := time.Now()
	cfg.Time = &now
	if len(r.TrustCA) > 0 {
		// The perimeter's CA, for curl, git and OpenSSL-based tools: one round trip, no shell.
		cfg.TrustCA = &agentproto.TrustCA{Path: api.CAPath, PEM: r.TrustCA}
	}
	if err := agent.Configure(bctx, cfg); err != nil {
		return fail("configure", err)
	}
	for i, mnt := range r.Mounts {
		if err := s.mount(bctx, agent, qemu.MountTag(i), mnt); err != nil {
			return fail("mounts", err)
		}
	}
	if err := mountVolumes(bctx, agent, r.Volumes); err != nil {
		return fail("volumes", err)
	}
	for _, f := range r.Files {
		if err := agent.CopyIn(bctx, agentproto.CopyInRequest{Path: f.Path, Mode: f.Mode, Size: int64(len(f.Data)), MkdirAll: true}, bytesReader(f.Data)); err != nil {
			return fail("files", err)
		}
	}
	p.finish("configure")
	s.serve(m)
	return api.StartResponse{PID: vm.Pid, Accel: vm.Accel, Steps: p.done}, nil
}

// dialAgent waits for the agent to answer on the virtio-serial channel, failing early if QEMU
// exits (a kernel panic under panic=-1 ends QEMU).
func (s *Service) dialAgent(ctx context.Context, m *machine) (*guest.Client, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.vm.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := guest.DialConfig(ctx, qemu.AgentSocket(m.dir), guest.Config{Logger: zerolog.Nop(), PortOpened: m.vm.QMP.PortOpened(ctx)})
	if err != nil {
		if m.vm.Exited() {
			return nil, fmt.Errorf("the VM exited during boot: %s", tail(qemu.ConsoleLog(m.dir), 400))
		}
		return nil, fmt.Errorf("the guest agent did not answer within %s: %w (console: %s)", s.cfg.BootTimeout, err, tail(qemu.ConsoleLog(m.dir), 400))
	}
	return c, nil
}

// serve registers a booted machine and starts its hybrid-vsock socket and watcher.
func (s *Service) serve(m *machine) {
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	s.mu.Lock()
	s.vms[m.id] = m
	s.mu.Unlock()
	go func() {
		if err := guest.ServeHybridVsock(ctx, m.agent, filepath.Join(m.dir, "vsock.sock"), m.dir); err != nil && ctx.Err() == nil && !s.isStopping(m) {
			s.log.Warn().Err(err).Str("sandbox", m.name).Msg("hybrid vsock stopped")
		}
	}()
	go s.watch(ctx, m)
	go s.watchListeners(ctx, m)
}

func (s *Service) isStopping(m *machine) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return m.stopping
}

// stop shuts the guest down cleanly (sync, unmount, power off) and waits for QEMU to exit;
// force, or a guest that does not finish in time, kills it. The disk stays.
func (s *Service) stop(ctx context.Context, r api.IDRequest) (api.Empty, error) {
	defer s.lockID(r.ID)()
	return s.stopLocked(ctx, r)
}

// lockID serialises lifecycle verbs on one sandbox; it returns the unlock.
func (s *Service) lockID(id string) func() {
	v, _ := s.idLocks.LoadOrStore(id, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

func (s *Service) stopLocked(ctx context.Context, r api.IDRequest) (api.Empty, error) {
	s.mu.Lock()
	m, ok := s.vms[r.ID]
	if ok {
		m.stopping = true
		delete(s.vms, r.ID)
	}
	s.mu.Unlock()
	if !ok {
		return api.Empty{}, nil // already stopped
	}
	if !r.Force {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		m.agent.Shutdown(sctx)
		err := m.vm.Wait(sctx)
		cancel()
		if err != nil {
			s.log.Warn().Str("sandbox", m.name).Msg("guest did not power off in time; killing it")
		}
	}
	if !m.vm.Exited() {
		m.vm.Kill()
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		m.vm.Wait(wctx)
		cancel()
	}
	m.teardown()
	return api.Empty{}, nil
}

func (s *Service) pause(ctx context.Context, r api.IDRequest) (api.Empty, error) {
	m, err := s.get(r.ID)
	if err != nil {
		return api.Empty{}, err
	}
	return api.Empty{}, m.vm.Pause(ctx)
}

func (s *Service) resume(ctx context.Context, r api.IDRequest) (api.Empty, error) {
	m, err := s.get(r.ID)
	if err != nil {
		return api.Empty{}, err
	}
	if err := m.vm.Resume(ctx); err != nil {
		return api.Empty{}, err
	}
	// The guest clock stood still while paused.
	now := time.Now()
	m.agent.Configure(ctx, agentproto.ConfigureRequest{Time: &now})
	return api.Empty{}, nil
}

// remove kills the VM if it runs and deletes everything of the sandbox on this host.
func (s *Service) remove(ctx context.Context, r api.IDRequest) (api.Empty, error) {
	defer s.lockID(r.ID)()
	if _, err := s.stopLocked(ctx, api.IDRequest{ID: r.ID, Force: true}); err != nil {
		return api.Empty{}, err
	}
	dir := s.cfg.Home.Sandbox(r.ID)
	if err := os.RemoveAll(dir); err != nil {
		return api.Empty{}, fmt.Errorf("remove %s: %w", dir, err)
	}
	if err := os.RemoveAll(s.volumeDir(r.ID)); err != nil {
		return api.Empty{}, fmt.Errorf("remove volumes of %s: %w", r.ID, err)
	}
	return api.Empty{}, nil
}

// adoptAll re-attaches to the QEMUs an earlier vmm left running. One that cannot be adopted
// is killed and reported failed, so the registry and reality agree and no QEMU is orphaned.
func (s *Service) adoptAll(ctx context.Context) {
	dirs, _ := filepath.Glob(filepath.Join(s.cfg.Home.Sandboxes(), "*", "qemu.pid"))
	for _, pidfile := range dirs {
		dir := filepath.Dir(pidfile)
		id := filepath.Base(dir)
		vm, err := s.drv.Adopt(ctx, dir)
		if err != nil {
			s.log.Warn().Err(err).Str("id", id).Msg("cannot adopt vm")
			s.reportFailed(id, "the vmm restarted and could not re-adopt the VM: "+err.Error())
			continue
		}
		m := &machine{id: id, name: id, dir: dir, vm: vm}
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		agent, err := guest.Dial(actx, qemu.AgentSocket(dir))
		cancel()
		if err != nil {
			m.stopping = true
			vm.Kill()
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			vm.Wait(wctx)
			wcancel()
			m.teardown()
			s.reportFailed(id, "the vmm restarted and the guest agent did not answer again; the VM was stopped")
			continue
		}
		m.agent = agent
		s.serve(m)
		s.log.Info().Str("id", id).Int("pid", vm.Pid).Msg("adopted running vm")
	}
}

func (s *Service) reportFailed(id, reason string) {
	b, _ := json.Marshal(api.VMEvent{ID: id, Failed: reason, Time: time.Now().UTC()})
	s.cfg.Bus.Publish(api.VMEventSubject(id), b)
}

// tail returns the last n bytes of a file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no console output)"
	}
	defer f.Close()
	fi, _ := f.Stat()
	off := max(fi.Size()-n, 0)
	buf := make([]byte, fi.Size()-off)
	f.ReadAt(buf, off)
	return string(buf)
}
