package vmm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/failpoint"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
	"github.com/IniZio/nexus/services/vmm/image"
	"github.com/IniZio/nexus/services/vmm/initramfs"
	"github.com/IniZio/nexus/services/vmm/kernel"
)

// Boot is data (firecracker-go-sdk's handlers are the model): a cold boot and a restore from a
// snapshot are lists of named steps run in order over one boot. Each step's name is what the
// create progress bar shows when it finishes and what an error says when it fails
// ("start: qemu: …"); when a step fails, the undos of the steps before it run in reverse, so a
// failed boot leaves no QEMU, socket or agent channel behind.
//
//	cold boot  kernel initramfs image disk volumes qemu    agent configure mounts files
//	restore    kernel initramfs       disk volumes restore agent configure mounts files
var (
	coldBoot    = concatSteps(prepareSteps, coldSteps, guestSteps)
	restoreBoot = concatSteps(prepareSteps, restoreSteps, guestSteps)
)

// prepareSteps fetch the kernel and build the initramfs, once per service lifetime.
var prepareSteps = []bootStep{
	{name: "kernel", run: (*boot).fetchKernel},
	{name: "initramfs", run: (*boot).buildInitramfs},
}

// coldSteps create the sandbox's disk and start the VM on it.
var coldSteps = []bootStep{
	{name: "image", run: (*boot).findImage},
	{name: "disk", run: (*boot).newDisk},
	{name: "volumes", run: (*boot).attachVolumes},
	{name: "qemu", run: (*boot).startVM, undo: (*boot).killVM},
}

// restoreSteps create a fork's disk over the snapshot's and restore the snapshot's VM (snapshot.go).
var restoreSteps = []bootStep{
	{name: "disk", run: (*boot).forkDisk},
	{name: "volumes", run: (*boot).copyVolumes},
	{name: "restore", run: (*boot).restoreVM, undo: (*boot).killVM},
}

// guestSteps reach the agent of a running VM and give the guest what it needs before use.
var guestSteps = []bootStep{
	{name: "agent", run: (*boot).dialAgent},
	{name: "configure", run: (*boot).configure},
	{name: "mounts", run: (*boot).mount},
	{name: "files", run: (*boot).copyFiles},
}

// bootStep is one named step of a boot. run does the work, or returns errSkip when there is
// nothing to do (the step is then not reported); undo, when set, reverses a step that ran if a
// later one fails. A step that fails cleans up after itself.
type bootStep struct {
	name string
	run  func(*boot, context.Context) error
	undo func(*boot)
}

// errSkip is what a step returns when it had nothing to do.
var errSkip = errors.New("nothing to do")

func concatSteps(lists ...[]bootStep) []bootStep {
	var out []bootStep
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// runSteps runs steps over b in order, telling finished of each that did something. When one
// fails, the undos of the steps that ran before it (not those skipped) run in reverse and the error names the step
// as "<op>: <step>: <error>". Invalid and conflict errors already are a sentence for the user and
// come back as they are.
func runSteps(ctx context.Context, op string, steps []bootStep, b *boot, finished func(step string)) error {
	var ran []bootStep
	for _, st := range steps {
		err := st.run(b, ctx)
		if errors.Is(err, errSkip) {
			continue
		}
		if err != nil {
			for i := len(ran) - 1; i >= 0; i-- {
				if ran[i].undo != nil {
					ran[i].undo(b)
				}
			}
			if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrConflict) {
				return err
			}
			return fmt.Errorf("%s: %s: %w", op, st.name, err)
		}
		ran = append(ran, st)
		finished(st.name)
		failpoint.Hit("vmm/" + op + "/" + st.name)
	}
	return nil
}

// bootingFile is in a sandbox directory from the first step of a boot that touches it until the
// boot finished or failed: a VM found with it was started by a vmm that crashed before the guest
// was configured, and is not adopted (adopt).
const bootingFile = "booting"

func markBooting(dir string) error {
	return atomicfile.WriteFile(filepath.Join(dir, bootingFile), []byte("booting\n"), 0o600)
}

func booting(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, bootingFile))
	return err == nil
}

func clearBooting(dir string) { os.Remove(filepath.Join(dir, bootingFile)) }

// bootFiles are the kernel and initramfs every guest boots.
type bootFiles struct {
	kernel *kernel.Kernel
	initrd string
}

// boot is one boot in progress: what was asked, and what the steps made so far.
type boot struct {
	s *Service

	// What the VM is booted with; a fork takes image, memory, vCPUs and mounts from its snapshot
	// (newForkBoot), and its volumes are the snapshot's.
	id, name      string
	hostname      string
	env           map[string]string
	image         string
	memoryMiB     int
	diskMiB       int
	vcpus         int
	cpus          float64
	diskBps       int64
	diskIOPS      int
	mounts        []api.Mount
	volumes       []api.Volume
	netSocket     string
	noPortForward bool
	files         []api.File
	trustCA       []byte
	progress      string

	// A fork's snapshot (snapshot.go), or a warm create's template (template.go: snapshot is
	// then "template <key>" and template the key).
	snapshot string
	info     api.SnapshotInfo
	snapDir  string
	template string

	// Made by the steps.
	kern     *kernel.Kernel
	initrd   string
	base     string // the root image
	imageKey string // and its key, recorded in the sandbox directory
	dir      string // the sandbox directory
	disk     string
	disks    []hypervisor.Disk // the volumes' disks
	spec     hypervisor.Spec   // what the VM was started with
	m        *machine
	deadline time.Time // the guest steps end by then: BootTimeout after the VM started
}

// newBoot is a cold boot of r.
func (s *Service) newBoot(r api.StartRequest) *boot {
	return &boot{
		s: s, id: r.ID, name: r.Name, hostname: r.Hostname, env: r.Env, image: r.Image,
		memoryMiB: r.MemoryMiB, diskMiB: r.DiskMiB, vcpus: r.VCPUs, cpus: r.CPUs,
		diskBps: r.DiskBps, diskIOPS: r.DiskIOPS, mounts: r.Mounts, volumes: r.Volumes,
		netSocket: r.NetSocket, noPortForward: r.NoPortForward, files: r.Files, trustCA: r.TrustCA,
		progress: r.Progress,
	}
}

// reporter sends named boot steps to a progress subject as they finish, and keeps them.
type reporter struct {
	s       *Service
	subject string
	last    time.Time
	done    []api.Step
}

func (p *reporter) finish(name string) {
	now := time.Now()
	st := api.Step{Name: name, Millis: now.Sub(p.last).Milliseconds(), Done: true}
	p.last = now
	p.done = append(p.done, st)
	if p.subject != "" {
		b, _ := json.Marshal(st)
		p.s.cfg.Bus.Publish(p.subject, b)
	}
}

// run boots b with steps, reports each step to b's progress subject, and serves the machine.
func (b *boot) run(ctx context.Context, op string, steps []bootStep) (api.StartResponse, error) {
	p := &reporter{s: b.s, subject: b.s.progressSubject(b.progress), last: time.Now()}
	err := runSteps(ctx, op, steps, b, p.finish)
	if b.dir != "" {
		clearBooting(b.dir) // done, or undone: either way nothing half-booted runs
	}
	if err != nil {
		return api.StartResponse{}, err
	}
	failpoint.Hit("vmm/" + op + "/booted")
	b.s.serve(b.m)
	return api.StartResponse{PID: b.m.vm.Pid(), Accel: b.m.vm.Accel(), Steps: p.done}, nil
}

// lockPrepared takes the lock of kernel and initramfs preparation; ready says an earlier boot
// prepared both, and b has them.
func (b *boot) lockPrepared() (unlock func(), ready bool) {
	b.s.bootMu.Lock()
	if bf := b.s.boot; bf != nil {
		b.kern, b.initrd = bf.kernel, bf.initrd
		ready = true
	}
	return b.s.bootMu.Unlock, ready
}

// fetchKernel fetches the guest kernel; the kernel and initramfs are cached on disk by their inputs
// and in memory once both are ready, so a boot after the first skips both steps.
func (b *boot) fetchKernel(ctx context.Context) error {
	unlock, ready := b.lockPrepared()
	defer unlock()
	if ready {
		return errSkip
	}
	k, err := kernel.Ensure(ctx, b.s.cfg.CacheDir, nil)
	if err != nil {
		return err
	}
	b.kern = k
	return nil
}

// buildInitramfs builds the initramfs whose /init is the guest agent.
func (b *boot) buildInitramfs(ctx context.Context) error {
	unlock, ready := b.lockPrepared()
	defer unlock()
	if ready {
		return errSkip
	}
	s := b.s
	initrd, err := initramfs.Build(b.kern, s.cfg.AgentPath, initramfs.DefaultModules, filepath.Join(s.cfg.CacheDir, "initramfs"))
	if err != nil {
		return err
	}
	b.initrd = initrd
	s.boot = &bootFiles{kernel: b.kern, initrd: initrd}
	return nil
}

// findImage finds the root image, building a built-in one or pulling a registry one on first
// use. A stopped sandbox that boots again on its disk keeps the image it was made from (the key
// in its directory), wherever its tag points now.
func (b *boot) findImage(ctx context.Context) error {
	dir := b.s.cfg.Home.Sandbox(b.id)
	if _, err := os.Stat(filepath.Join(dir, "disk.qcow2")); err == nil {
		if key, err := os.ReadFile(filepath.Join(dir, imageFile)); err == nil {
			info, err := image.Resolve(b.s.cfg.Home, strings.TrimSpace(string(key)))
			if err != nil { // a built-in image removed meanwhile is built again
				info, err = b.s.ensureImage(ctx, strings.TrimSpace(string(key)), b.progress)
			}
			if err != nil {
				return err
			}
			b.base, b.imageKey = info.Path, info.Key
			return nil
		}
	}
	info, err := b.s.ensureImage(ctx, b.image, b.progress)
	if err != nil {
		return err
	}
	b.base, b.imageKey = info.Path, info.Key
	return nil
}

// sandboxDir creates the sandbox directory (a template build's is set before) and records
// whether its listeners are forwarded.
func (b *boot) sandboxDir() error {
	if b.dir == "" {
		b.dir = b.s.cfg.Home.Sandbox(b.id)
	}
	b.disk = filepath.Join(b.dir, "disk.qcow2")
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return err
	}
	if err := markBooting(b.dir); err != nil {
		return err
	}
	return setPortForward(b.dir, !b.noPortForward)
}

// newDisk creates the sandbox's qcow2 overlay over the base image; a stopped sandbox boots again
// on the disk it had.
func (b *boot) newDisk(ctx context.Context) error {
	if err := b.sandboxDir(); err != nil {
		return err
	}
	if _, err := os.Stat(b.disk); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.WriteFile(filepath.Join(b.dir, imageFile), []byte(b.imageKey+"\n"), 0o600); err != nil {
		return err
	}
	if err := image.NewOverlaySized(b.base, b.disk, int64(b.diskMiB)<<20); err != nil {
		return err
	}
	return os.Chmod(b.disk, 0o600) // the guest's disk: for this user only
}

// machineSpec is the VM every boot starts: the kernel, the disk and the sandbox's devices.
func (b *boot) machineSpec() hypervisor.Spec {
	spec := hypervisor.Spec{
		ID: b.id, Dir: b.dir, Kernel: b.kern.VmlinuxPath, KernelVersion: b.kern.Version, Initrd: b.initrd,
		Hostname: b.hostname, MemoryMiB: b.memoryMiB, VCPUs: b.vcpus, CPUs: b.cpus,
		DiskBps: b.diskBps, DiskIOPS: b.diskIOPS, Disk: b.disk, NetSocket: b.netSocket,
	}
	if spec.Kernel == "" {
		spec.Kernel = b.kern.VmlinuzPath
	}
	asRoot := runsAsRoot(b.s.imageConfig(b.dir))
	for i, m := range b.mounts {
		spec.Mounts = append(spec.Mounts, hypervisor.Mount{HostPath: m.Host, Tag: hypervisor.MountTag(i), ReadOnly: m.ReadOnly,
			Guest: m.Guest, Remount: m.Remount, Virtiofs: wantsVirtiofs(m, asRoot)})
	}
	spec.FreePageReporting = hypervisor.ReportsFreePages(spec.Mounts)
	spec.ExtraDisks = b.disks
	return spec
}

// attachVolumes creates the named volumes that do not exist yet and adds them as disks.
func (b *boot) attachVolumes(ctx context.Context) error {
	if len(b.volumes) == 0 {
		return errSkip
	}
	disks, err := b.s.attachVolumes(ctx, b.id, b.volumes)
	b.disks = disks
	return err
}

// startVM starts the VM on the driver (QEMU today, hence the step name).
func (b *boot) startVM(ctx context.Context) error {
	b.spec = b.machineSpec()
	if b.netSocket != "" {
		b.spec.Net = &guestNet
	}
	vm, err := b.s.drv.Start(ctx, b.spec)
	if err != nil {
		return err
	}
	b.spec = vm.Spec() // which shares the driver serves over virtiofs
	b.running(vm)
	return nil
}

// guestNet is eth0 of every guest with a NIC: each sandbox has a netstack of its own.
var guestNet = hypervisor.GuestNet{IP: "192.168.127.2/24", Gateway: "192.168.127.1", DNS: "192.168.127.1"}

// running records the VM a step started.
func (b *boot) running(vm hypervisor.VM) {
	b.m = &machine{id: b.id, name: b.name, dir: b.dir, vm: vm}
	b.deadline = time.Now().Add(b.s.cfg.BootTimeout)
}

// killVM is the undo of starting or restoring the VM: it kills it and releases the host side.
func (b *boot) killVM() {
	b.m.stopping = true
	b.m.kill()
	b.m.teardown()
}

// dialAgent waits for the guest agent's handshake. A restored guest (a fork, a warm create) was
// saved while its agent served a host, so its port is open from the start.
func (b *boot) dialAgent(ctx context.Context) error {
	ctx, cancel := context.WithDeadline(ctx, b.deadline)
	defer cancel()
	agent, err := b.s.dialAgent(ctx, b.m, b.snapshot != "")
	if err != nil {
		return err
	}
	b.m.agent = agent
	if errs := agent.Agent().BootErrors; len(errs) > 0 {
		return fmt.Errorf("the guest did not boot cleanly: %s", strings.Join(errs, "; "))
	}
	return nil
}

// configure gives the guest its hostname, environment, clock and, when set, the perimeter's CA.
func (b *boot) configure(ctx context.Context) error {
	ctx, cancel := context.WithDeadline(ctx, b.deadline)
	defer cancel()
	now := time.Now()
	// A fresh identity on every boot, cold or restored from a template (template.go): one
	// configure path for both, so they cannot drift.
	seed := make([]byte, 64)
	rand.Read(seed)
	cfg := agentproto.ConfigureRequest{Hostname: b.hostname, Env: withImageEnv(b.env, b.s.imageConfig(b.dir)), Time: &now,
		Seed: seed, MachineID: machineID(b.id)}
	if b.snapshot != "" && b.netSocket != "" && b.info.Net {
		// A restored guest has the MAC of the VM it was saved from (a template's, or the
		// snapshotted sandbox's): it takes the one a cold boot of this sandbox has, before
		// anything runs in it. Its IP is its own netstack's lease.
		cfg.Network = &agentproto.NetworkConfig{Address: guestNet.IP, Gateway: guestNet.Gateway, MAC: hypervisor.MACFor(b.id)}
	}
	if len(b.trustCA) > 0 {
		// The perimeter's CA, for curl, git and OpenSSL-based tools: one round trip, no shell.
		cfg.TrustCA = &agentproto.TrustCA{Path: api.CAPath, PEM: b.trustCA}
	}
	return b.m.agent.Configure(ctx, cfg)
}

// machineID is a sandbox's /etc/machine-id: stable across its boots, its own.
func machineID(id string) string {
	h := sha256.Sum256([]byte("nexus-machine-id\x00" + id))
	return hex.EncodeToString(h[:16])
}

// mount mounts the 9p shares and the named volumes in the guest. A restored guest has its
// volumes mounted already (b.volumes is empty); its shares were dropped for the snapshot.
func (b *boot) mount(ctx context.Context) error {
	if len(b.spec.Mounts) == 0 && len(b.volumes) == 0 {
		return errSkip
	}
	ctx, cancel := context.WithDeadline(ctx, b.deadline)
	defer cancel()
	all := make([]int, len(b.spec.Mounts))
	for i := range all {
		all[i] = i
	}
	if err := b.s.remount(ctx, b.m.agent, b.spec, all); err != nil {
		return err
	}
	return mountVolumes(ctx, b.m.agent, b.volumes)
}

// copyFiles writes the request's files into the guest.
func (b *boot) copyFiles(ctx context.Context) error {
	if len(b.files) == 0 {
		return errSkip
	}
	ctx, cancel := context.WithDeadline(ctx, b.deadline)
	defer cancel()
	for _, f := range b.files {
		req := agentproto.CopyInRequest{Path: f.Path, Mode: f.Mode, Size: int64(len(f.Data)), MkdirAll: true}
		if err := b.m.agent.CopyIn(ctx, req, bytesReader(f.Data)); err != nil {
			return err
		}
	}
	return nil
}
