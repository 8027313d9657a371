package vmm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/agentproto"
	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/guest"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// start boots the VM of a sandbox (coldBoot) and returns once its agent answered and is
// configured. A stopped sandbox boots again on the disk it had.
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
	release, err := s.admit(r.ID, r.MemoryMiB, r.VCPUs)
	if err != nil {
		return api.StartResponse{}, err
	}
	defer release()
	return s.newBoot(r).run(ctx, "start", coldBoot)
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
	c, err := guest.DialConfig(ctx, hypervisor.AgentSocket(m.dir), guest.Config{Logger: zerolog.Nop(), PortOpened: m.vm.AgentPortOpened(ctx)})
	if err != nil {
		if m.vm.Exited() {
			return nil, fmt.Errorf("the VM exited during boot: %s", tail(hypervisor.ConsoleLog(m.dir), 400))
		}
		return nil, fmt.Errorf("the guest agent did not answer within %s: %w (console: %s)", s.cfg.BootTimeout, err, tail(hypervisor.ConsoleLog(m.dir), 400))
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
	m.kill()
	m.teardown()
	return api.Empty{}, nil
}

// kill ends QEMU unless it has exited, and waits (bounded) until it is gone.
func (m *machine) kill() {
	if m.vm.Exited() {
		return
	}
	m.vm.Kill()
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	m.vm.Wait(wctx)
	cancel()
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
		agent, err := guest.Dial(actx, hypervisor.AgentSocket(dir))
		cancel()
		if err != nil {
			m.stopping = true
			m.kill()
			m.teardown()
			s.reportFailed(id, "the vmm restarted and the guest agent did not answer again; the VM was stopped")
			continue
		}
		m.agent = agent
		s.serve(m)
		s.log.Info().Str("id", id).Int("pid", vm.Pid()).Msg("adopted running vm")
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
