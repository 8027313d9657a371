package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
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

// start boots the VM of a sandbox (coldBoot, or warmBoot from a template for a new one) and
// returns once its agent answered and is configured. A stopped sandbox boots again on the disk
// it had.
func (s *Service) start(ctx context.Context, r api.StartRequest) (api.StartResponse, error) {
	// A stop or remove that arrives while this boot runs waits for it, then undoes it: no VM
	// can be left running behind a record that is gone.
	defer s.lockID(r.ID)()
	if err := s.notRunning(r.ID, r.Name); err != nil {
		return api.StartResponse{}, err
	}
	s.awaitAdoptions() // admission counts the VMs an earlier vmm left
	if err := s.admitDisk(r.ID, r.DiskMiB, r.Volumes); err != nil {
		return api.StartResponse{}, err
	}
	release, err := s.admit(r.ID, r.MemoryMiB, r.VCPUs)
	if err != nil {
		return api.StartResponse{}, err
	}
	defer release()
	if _, err := os.Stat(filepath.Join(s.cfg.Home.Sandbox(r.ID), "disk.qcow2")); errors.Is(err, os.ErrNotExist) {
		return s.startWarm(ctx, r) // a new sandbox: restored from its shape's template when there is one
	}
	return s.newBoot(r).run(ctx, "start", coldBoot)
}

// dialAgent waits for the agent to answer on the virtio-serial channel, failing early if QEMU
// exits (a kernel panic under panic=-1 ends QEMU). portOpen: the guest has its port open already
// (restored or adopted), see guest.Config.
func (s *Service) dialAgent(ctx context.Context, m *machine, portOpen bool) (*guest.Client, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.vm.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := guest.DialConfig(ctx, hypervisor.AgentSocket(m.dir), guest.Config{Logger: zerolog.Nop(), PortOpened: m.vm.AgentPortOpened(ctx), PortOpen: portOpen})
	if err != nil {
		if m.vm.Exited() {
			return nil, fmt.Errorf("the VM exited during boot: %s", tail(hypervisor.ConsoleLog(m.dir), 400))
		}
		return nil, fmt.Errorf("the guest agent did not answer within %s: %w (console: %s)", s.cfg.BootTimeout, err, tail(hypervisor.ConsoleLog(m.dir), 400))
	}
	return c, nil
}

// notRunning refuses to boot id while it has a VM (once any adoption of it has finished), and
// forgets why an earlier VM of id failed.
func (s *Service) notRunning(id, name string) error {
	s.awaitAdoption(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.vms[id]; ok {
		return errdefs.Conflict("sandbox %s is already running", name)
	}
	delete(s.failed, id)
	return nil
}

// serve registers a booted machine and starts its hybrid-vsock socket and watcher.
func (s *Service) serve(m *machine) {
	s.register(m)
	close(m.awake)
	s.serveGuest(m)
}

// register makes m one of the running machines.
func (s *Service) register(m *machine) {
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if m.awake == nil {
		m.awake = make(chan struct{})
	}
	s.mu.Lock()
	s.vms[m.id] = m
	s.mu.Unlock()
}

// serveGuest starts what talks to the guest of a registered machine that has its agent: the
// hybrid-vsock socket, the watcher and the listener scan.
func (s *Service) serveGuest(m *machine) {
	ctx := m.ctx
	why := newWhyServer(m.id, s.gatewayWhy)
	m.agent.ServeLocal(agentproto.WhyPort, func(c net.Conn) { why.serve(ctx, c) })
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
	if !r.Force && m.agent != nil { // a VM adopted paused cannot shut down: it is killed
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
	m, err := s.lookup(r.ID)
	if err != nil {
		return api.Empty{}, err
	}
	return api.Empty{}, m.vm.Pause(ctx)
}

func (s *Service) resume(ctx context.Context, r api.IDRequest) (api.Empty, error) {
	defer s.lockID(r.ID)() // a stop waits for the agent of a VM adopted paused to be dialed
	m, err := s.lookup(r.ID)
	if err != nil {
		return api.Empty{}, err
	}
	if err := m.vm.Resume(ctx); err != nil {
		return api.Empty{}, err
	}
	if err := s.wake(ctx, m); err != nil {
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

// adoptAll re-attaches to the QEMUs an earlier vmm left running, each in its own goroutine, and
// returns at once: the endpoints are served meanwhile, and a request about a VM still being
// adopted waits for it (awaitAdoption).
func (s *Service) adoptAll(ctx context.Context) {
	// A boot the previous vmm began and never got to start QEMU for: nothing runs, and the
	// gateway that waits for that boot hears it failed.
	marks, _ := filepath.Glob(filepath.Join(s.cfg.Home.Sandboxes(), "*", bootingFile))
	for _, mark := range marks {
		dir := filepath.Dir(mark)
		if _, err := os.Stat(filepath.Join(dir, "qemu.pid")); errors.Is(err, os.ErrNotExist) {
			clearBooting(dir)
			s.adoptFailed(filepath.Base(dir), "nexus restarted while the sandbox was booting, before its VM started; start it again")
		}
	}
	pidfiles, _ := filepath.Glob(filepath.Join(s.cfg.Home.Sandboxes(), "*", "qemu.pid"))
	for _, pidfile := range pidfiles {
		dir := filepath.Dir(pidfile)
		id := filepath.Base(dir)
		done := make(chan struct{})
		s.mu.Lock()
		s.adopting[id] = done
		s.mu.Unlock()
		go func() {
			unlock := s.lockID(id)
			defer unlock()
			s.adopt(ctx, id, dir)
			s.mu.Lock()
			delete(s.adopting, id)
			s.mu.Unlock()
			close(done)
		}()
	}
}

// adopt re-attaches to one VM. A VM whose boot had not finished (its guest may lack its
// configuration), or that cannot be adopted, is killed and reported failed, so the registry and
// reality agree and no QEMU is orphaned. A paused VM is adopted paused: its guest cannot answer
// until it is resumed, when its agent is dialed (wake).
func (s *Service) adopt(ctx context.Context, id, dir string) {
	vm, err := s.drv.Adopt(ctx, dir)
	if errors.Is(err, errdefs.ErrNotFound) {
		// Its QEMU is gone (a host reboot, or it was killed while nexus was down): nothing
		// runs, so its pidfile goes too and the next vmm does not look for it again.
		s.log.Warn().Err(err).Str("id", id).Msg("vm gone while the vmm was down")
		os.Remove(filepath.Join(dir, "qemu.pid"))
		clearBooting(dir)
		s.adoptFailed(id, "the VM ended while nexus was not running (a host restart, or QEMU was killed); its disk is kept: start it again")
		return
	}
	if err != nil {
		s.log.Warn().Err(err).Str("id", id).Msg("cannot adopt vm")
		s.adoptFailed(id, "the vmm restarted and could not re-adopt the VM: "+err.Error())
		return
	}
	m := &machine{id: id, name: id, dir: dir, vm: vm}
	giveUp := func(reason string) {
		m.stopping = true
		m.kill()
		m.teardown()
		s.adoptFailed(id, reason)
	}
	if booting(dir) {
		giveUp("nexus restarted while the VM was booting, before its guest was configured; the VM was stopped: start it again")
		clearBooting(dir)
		return
	}
	if paused, err := vm.Paused(ctx); err == nil && paused {
		s.register(m)
		go s.watchPaused(m)
		s.log.Info().Str("id", id).Int("pid", vm.Pid()).Msg("adopted paused vm")
		return
	}
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	agent, err := guest.Dial(actx, hypervisor.AgentSocket(dir))
	cancel()
	if err != nil {
		giveUp("the vmm restarted and the guest agent did not answer again; the VM was stopped")
		return
	}
	m.agent = agent
	s.serve(m)
	s.log.Info().Str("id", id).Int("pid", vm.Pid()).Msg("adopted running vm")
}

// adoptFailed reports a VM that adoption gave up, and keeps the reason for Inspect: the
// gateway may not listen to the event yet while both start.
func (s *Service) adoptFailed(id, reason string) {
	s.mu.Lock()
	s.failed[id] = reason
	s.mu.Unlock()
	s.reportFailed(id, reason)
}

// watchPaused watches a VM adopted paused until it is woken: only QEMU's exit can happen.
func (s *Service) watchPaused(m *machine) {
	select {
	case <-m.awake:
	case <-m.ctx.Done():
	case <-m.vm.Done():
		s.lost(m, "the VM exited unexpectedly while paused (see nexus logs)")
	}
}

// wake dials the agent of a machine adopted paused, now resumed, and serves its guest. One
// whose agent does not answer is killed and reported failed.
func (s *Service) wake(ctx context.Context, m *machine) error {
	s.mu.Lock()
	awake := m.agent != nil
	s.mu.Unlock()
	if awake {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	agent, err := s.dialAgent(dctx, m, true) // the guest served the vmm that adopted it
	cancel()
	if err != nil {
		reason := "the guest agent did not answer after the VM was resumed; the VM was stopped"
		s.lost(m, reason)
		return errdefs.Unavailable("resume %s: %s", m.id, reason)
	}
	s.mu.Lock()
	m.agent = agent
	s.mu.Unlock()
	close(m.awake)
	s.serveGuest(m)
	return nil
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
