package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/agentproto"
	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/failpoint"
	"github.com/IniZio/nexus/services/vmm/guest"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
	"github.com/IniZio/nexus/services/vmm/image"
	"github.com/IniZio/nexus/services/vmm/internal/fsutil"
)

// Snapshots and forks (DESIGN §4). A snapshot of a running sandbox is a directory
// $NEXUS_HOME/snapshots/<name>/ holding
//
//	state          the device state (QEMU migration stream with x-ignore-shared, tens of KB)
//	ram            a sparse copy of the guest RAM file, exactly MemoryMiB MiB long
//	disk.qcow2     a copy of the sandbox's disk overlay (backed by the read-only base image)
//	volumes/*.ext4 copies of its named volumes
//	snapshot.json  api.SnapshotInfo
//
// It is assembled in a temporary directory and renamed into place, so a crash leaves either a
// whole snapshot or none. The parent is stopped while state, RAM and disk are copied, then resumes.
//
// A fork is a new QEMU that maps ram privately (share=off: pages come lazily from the page cache
// of the file and are copied on first write, so idle forks share them) over its own qcow2 overlay
// whose backing file is the snapshot's disk.qcow2, loads the device state and continues. The guest
// agent is reached again with a fresh handshake, then gets the fork's hostname, environment and
// clock. The fork's directory records the snapshot in the file "snapshot".

// snapshotFile, in a fork's sandbox directory, names the snapshot its disk is backed by.
const snapshotFile = "snapshot"

func (s *Service) snapshotDir(name string) string { return filepath.Join(s.cfg.Home.Snapshots(), name) }

func ramFile(dir string) string   { return filepath.Join(dir, "ram") }
func stateFile(dir string) string { return filepath.Join(dir, "state") }
func diskFile(dir string) string  { return filepath.Join(dir, "disk.qcow2") }
func metaFile(dir string) string  { return filepath.Join(dir, "snapshot.json") }
func snapVolume(dir, name string) string {
	return filepath.Join(dir, "volumes", name+".ext4")
}

// snapshotCreate stops the sandbox's vCPUs, saves device state, RAM, disk and volumes into a new
// snapshot, and resumes the sandbox (unless it was paused before).
func (s *Service) snapshotCreate(ctx context.Context, r api.SnapshotRequest) (api.SnapshotInfo, error) {
	if err := api.CheckSnapshotName(r.Snapshot); err != nil {
		return api.SnapshotInfo{}, err
	}
	defer s.lockID(r.ID)() // no stop or remove while the VM is stopped for the copy
	m, err := s.get(r.ID)
	if err != nil {
		return api.SnapshotInfo{}, err
	}
	spec := m.vm.Spec()
	if spec.Kernel == "" {
		return api.SnapshotInfo{}, errdefs.Unavailable("snapshot: sandbox %s was started by an older vmm; stop and start it first", m.name)
	}
	remount, fixed := splitMounts(spec)
	if len(fixed) > 0 {
		op := r.Op
		if op != "fork" {
			op = "snapshot create"
		}
		return api.SnapshotInfo{}, s.mountRefusal(ctx, m, spec, fixed, op)
	}
	if _, busy := s.snapping.LoadOrStore(m.id, true); busy {
		return api.SnapshotInfo{}, errdefs.Conflict("sandbox %s is being snapshotted already; try again when that finishes", m.name)
	}
	defer s.snapping.Delete(m.id)
	final := s.snapshotDir(r.Snapshot)
	if _, err := os.Stat(final); err == nil {
		return api.SnapshotInfo{}, errdefs.Conflict("snapshot %s already exists", r.Snapshot)
	}
	img, _ := os.ReadFile(filepath.Join(m.dir, imageFile))
	info := api.SnapshotInfo{
		Name: r.Snapshot, Host: s.cfg.Host, ParentID: m.id, Image: strings.TrimSpace(string(img)),
		MemoryMiB: spec.MemoryMiB, VCPUs: spec.VCPUs, Accel: m.vm.Accel(), Net: spec.NetSocket != "",
		KernelVersion: spec.KernelVersion, Created: time.Now().UTC(),
	}
	for _, d := range spec.ExtraDisks {
		info.Volumes = append(info.Volumes, api.Volume{Name: strings.TrimSuffix(filepath.Base(d.Path), ".ext4")})
	}
	for _, i := range remount {
		mt := spec.Mounts[i]
		info.Mounts = append(info.Mounts, api.Mount{Host: mt.HostPath, Guest: mt.Guest, ReadOnly: mt.ReadOnly, Remount: true})
	}
	if err := os.MkdirAll(s.cfg.Home.Snapshots(), 0o700); err != nil {
		return api.SnapshotInfo{}, err
	}
	tmp, err := os.MkdirTemp(s.cfg.Home.Snapshots(), ".tmp-"+r.Snapshot+"-")
	if err != nil {
		return api.SnapshotInfo{}, err
	}
	committed := false
	defer func() {
		if !committed {
			os.RemoveAll(tmp)
		}
	}()
	wasPaused, err := m.vm.Paused(ctx)
	if err != nil {
		return api.SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", r.Snapshot, err)
	}
	if wasPaused && len(remount) > 0 {
		return api.SnapshotInfo{}, errdefs.Conflict("snapshot %s: sandbox %s is paused with %s mounted from the host; resume it first (the mount is dropped for the snapshot and mounted again)",
			r.Snapshot, m.name, spec.Mounts[remount[0]].Guest)
	}
	// QEMU cannot save a VM while the guest has a 9p export mounted: drop the remountable ones
	// for the copy and mount them again after.
	if err := s.unmountForSnapshot(ctx, m, spec, remount); err != nil {
		return api.SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", r.Snapshot, err)
	}
	paused := time.Now()
	err = s.capture(ctx, m, spec, tmp, &info)
	failpoint.Hit("vmm/snapshot/copied")
	if !wasPaused {
		if rerr := m.vm.Resume(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("resume after snapshot: %w", rerr))
		}
		info.PausedMillis = time.Since(paused).Milliseconds()
		// The guest clock stood still while stopped.
		now := time.Now()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		m.agent.Configure(cctx, agentproto.ConfigureRequest{Time: &now})
		cancel()
	}
	if len(remount) > 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		if rerr := s.remount(rctx, m.agent, spec, remount); rerr != nil {
			err = errors.Join(err, fmt.Errorf("mounting again after the snapshot: %w", rerr))
		}
		cancel()
	}
	if err != nil {
		return api.SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", r.Snapshot, err)
	}
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := atomicfile.WriteFile(metaFile(tmp), b, 0o600); err != nil {
		return api.SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", r.Snapshot, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		if errors.Is(err, os.ErrExist) || errors.Is(err, unix.ENOTEMPTY) {
			return api.SnapshotInfo{}, errdefs.Conflict("snapshot %s already exists", r.Snapshot)
		}
		return api.SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", r.Snapshot, err)
	}
	committed = true
	fsutil.SyncDir(s.cfg.Home.Snapshots())
	failpoint.Hit("vmm/snapshot/saved")
	s.log.Info().Str("sandbox", m.name).Str("snapshot", r.Snapshot).Int64("paused_ms", info.PausedMillis).
		Int64("ram_data", info.RAMDataBytes).Msg("snapshot created")
	return info, nil
}

// capture writes state, RAM, disk and volumes of a stopped-by-SaveState VM into dir.
func (s *Service) capture(ctx context.Context, m *machine, spec hypervisor.Spec, dir string, info *api.SnapshotInfo) error {
	if err := m.vm.SaveState(ctx, stateFile(dir)); err != nil {
		return err
	}
	failpoint.Hit("vmm/snapshot/state")
	// After the migration QEMU has flushed and released the disks; the RAM file is quiescent.
	n, err := fsutil.CopySparse(m.vm.RAMPath(), ramFile(dir))
	if err != nil {
		return fmt.Errorf("ram: %w", err)
	}
	info.RAMDataBytes = n
	if _, err := fsutil.CopySparse(spec.Disk, diskFile(dir)); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	for i, d := range spec.ExtraDisks {
		if err := os.MkdirAll(filepath.Join(dir, "volumes"), 0o700); err != nil {
			return err
		}
		if _, err := fsutil.CopySparse(d.Path, snapVolume(dir, info.Volumes[i].Name)); err != nil {
			return fmt.Errorf("volume %s: %w", info.Volumes[i].Name, err)
		}
	}
	for p, dst := range map[string]*int64{stateFile(dir): &info.StateBytes, ramFile(dir): &info.RAMBytes, diskFile(dir): &info.DiskBytes} {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		*dst = fi.Size()
	}
	if info.RAMBytes != int64(spec.MemoryMiB)<<20 {
		return fmt.Errorf("ram: the RAM file is %d bytes, expected %d", info.RAMBytes, int64(spec.MemoryMiB)<<20)
	}
	return nil
}

// splitMounts sorts a sandbox's 9p mounts (indices into spec.Mounts) into those a snapshot may
// drop and mount again and those that refuse it.
func splitMounts(spec hypervisor.Spec) (remount, fixed []int) {
	for i, mt := range spec.Mounts {
		if mt.Remount && mt.Guest != "" {
			remount = append(remount, i)
		} else {
			fixed = append(fixed, i)
		}
	}
	return remount, fixed
}

// unmountForSnapshot drops the mounts idx in the guest; if one cannot be dropped (busy), those
// already dropped are mounted again and the snapshot is refused.
func (s *Service) unmountForSnapshot(ctx context.Context, m *machine, spec hypervisor.Spec, idx []int) error {
	var done []int
	for _, i := range idx {
		g := spec.Mounts[i].Guest
		out := &capped{max: 4 << 10}
		st, err := m.agent.Exec(ctx, guest.ExecRequest{Argv: []string{"umount", g}}, nil, out, out, nil)
		if err == nil && st.Code != 0 {
			err = errors.New(errdefs.FirstLine(out.String()))
		}
		if err != nil {
			if rerr := s.remount(context.WithoutCancel(ctx), m.agent, spec, done); rerr != nil {
				s.log.Warn().Err(rerr).Str("sandbox", m.name).Msg("mounting again after a refused snapshot")
			}
			return errdefs.Conflict("%s could not be unmounted in the guest for the snapshot (%v); close what holds it open and retry", g, err)
		}
		done = append(done, i)
	}
	return nil
}

// remount mounts spec.Mounts[idx] in the guest again.
func (s *Service) remount(ctx context.Context, agent *guest.Client, spec hypervisor.Spec, idx []int) error {
	var errs []error
	for _, i := range idx {
		mt := spec.Mounts[i]
		if err := s.mount(ctx, agent, mt.TagAt(i), mt); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountRefusal names the host→guest pairs of the sandbox's 9p mounts idx.
func (s *Service) mountRefusal(ctx context.Context, m *machine, spec hypervisor.Spec, idx []int, op string) error {
	// The guest's answer is untrusted: bounded, and only used to name mount points.
	guestOf := map[string]string{}
	out := &capped{max: 64 << 10}
	if st, err := m.agent.Exec(ctx, guest.ExecRequest{Argv: []string{"cat", "/proc/mounts"}}, nil, out, io.Discard, nil); err == nil && st.Code == 0 {
		for _, l := range strings.Split(out.String(), "\n") {
			f := strings.Fields(l)
			if len(f) >= 3 && (f[2] == "9p" || f[2] == "virtiofs") && len(f[1]) <= 256 {
				guestOf[f[0]] = strings.ToValidUTF8(f[1], "?")
			}
		}
	}
	var pairs []string
	for _, i := range idx {
		mt := spec.Mounts[i]
		g := guestOf[mt.TagAt(i)]
		if g == "" {
			g = "(not mounted)"
		}
		pairs = append(pairs, mt.HostPath+"→"+g)
	}
	return errdefs.Refused("%s refused: sandbox %s has live mounts %s; snapshots and forks of a mounted sandbox are not supported", op, m.name, strings.Join(pairs, ", "))
}

// loadSnapshot reads a snapshot's record and checks, in O(1), that its files have the lengths
// recorded: a truncated or damaged snapshot is refused before any fork starts from it.
func (s *Service) loadSnapshot(name string) (api.SnapshotInfo, string, error) {
	var info api.SnapshotInfo
	if err := api.CheckSnapshotName(name); err != nil {
		return info, "", err
	}
	dir := s.snapshotDir(name)
	b, err := os.ReadFile(metaFile(dir))
	if errors.Is(err, os.ErrNotExist) {
		return info, "", errdefs.NotFound("no snapshot named %s on host %s", name, s.cfg.Host)
	}
	if err != nil {
		return info, "", err
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, "", errdefs.Refused("snapshot %s is damaged: its record does not parse", name)
	}
	if why := damage(dir, info); why != "" {
		return info, "", errdefs.Refused("snapshot %s is damaged: %s; no fork was started", name, why)
	}
	return info, dir, nil
}

// damage says what is wrong with the files of the snapshot in dir, recorded as info: a file
// missing or not of the length recorded (a RAM file gone, say); empty when they are whole.
func damage(dir string, info api.SnapshotInfo) string {
	want := int64(info.MemoryMiB) << 20
	checks := []struct {
		what string
		path string
		size int64
	}{
		{"RAM file", ramFile(dir), want},
		{"RAM file", ramFile(dir), info.RAMBytes},
		{"device state", stateFile(dir), info.StateBytes},
		{"disk", diskFile(dir), info.DiskBytes},
	}
	for _, c := range checks {
		fi, err := os.Stat(c.path)
		if err != nil {
			return fmt.Sprintf("its %s is missing", c.what)
		}
		if fi.Size() != c.size || c.size <= 0 {
			return fmt.Sprintf("its %s is %d bytes, expected %d", c.what, fi.Size(), c.size)
		}
	}
	for _, v := range info.Volumes {
		if _, err := os.Stat(snapVolume(dir, v.Name)); err != nil {
			return fmt.Sprintf("volume %s is missing", v.Name)
		}
	}
	return ""
}

// fork boots a new sandbox's VM from a snapshot (restoreBoot).
func (s *Service) fork(ctx context.Context, r api.ForkRequest) (api.StartResponse, error) {
	s.snapMu.RLock()
	defer s.snapMu.RUnlock()
	info, sdir, err := s.loadSnapshot(r.Snapshot)
	if err != nil {
		return api.StartResponse{}, err
	}
	if info.Net != (r.NetSocket != "") {
		return api.StartResponse{}, errdefs.Invalid("fork of %s: the snapshot's VM %s a network device; the fork must match", r.Snapshot, map[bool]string{true: "has", false: "has no"}[info.Net])
	}
	if !sandboxIDRe.MatchString(r.ID) {
		return api.StartResponse{}, errdefs.Invalid("fork: bad sandbox id %q", r.ID)
	}
	defer s.lockID(r.ID)() // like start: a stop or remove during the fork waits for it
	s.mu.Lock()
	_, running := s.vms[r.ID]
	s.mu.Unlock()
	if running {
		return api.StartResponse{}, errdefs.Conflict("sandbox %s is already running", r.Name)
	}
	release, err := s.admit(r.ID, info.MemoryMiB, info.VCPUs)
	if err != nil {
		return api.StartResponse{}, err
	}
	defer release()
	return s.newForkBoot(r, info, sdir).run(ctx, "fork", restoreBoot)
}

// newForkBoot is a restore of snapshot info (in sdir) into the new sandbox of r. The fork has
// the parent's devices in the parent's order: the saved device state needs them.
func (s *Service) newForkBoot(r api.ForkRequest, info api.SnapshotInfo, sdir string) *boot {
	b := &boot{
		s: s, id: r.ID, name: r.Name, hostname: r.Hostname, env: r.Env, image: info.Image,
		memoryMiB: info.MemoryMiB, vcpus: info.VCPUs, cpus: r.CPUs, diskBps: r.DiskBps, diskIOPS: r.DiskIOPS,
		netSocket: r.NetSocket, noPortForward: r.NoPortForward,
		progress: r.Progress, snapshot: r.Snapshot, info: info, snapDir: sdir,
	}
	for _, mt := range info.Mounts {
		b.mounts = append(b.mounts, api.Mount{Host: mt.Host, Guest: mt.Guest, ReadOnly: mt.ReadOnly, Remount: true})
	}
	return b
}

// forkDisk creates the fork's qcow2 overlay over the snapshot's disk. A disk that a fork from
// the same snapshot left (one cut off by a crash or failed before the gateway recorded it
// running, which alone asks for a fork again) is made anew.
func (b *boot) forkDisk(ctx context.Context) error {
	dir := b.s.cfg.Home.Sandbox(b.id)
	if _, err := os.Stat(filepath.Join(dir, "disk.qcow2")); err == nil {
		if from, _ := os.ReadFile(filepath.Join(dir, snapshotFile)); strings.TrimSpace(string(from)) != b.snapshot {
			return errdefs.Conflict("sandbox %s already has a disk; a fork needs a new sandbox", b.name)
		}
		if err := os.Remove(filepath.Join(dir, "disk.qcow2")); err != nil {
			return err
		}
	}
	if err := b.sandboxDir(); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(b.dir, imageFile), []byte(b.image+"\n"), 0o600); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(b.dir, snapshotFile), []byte(b.snapshot+"\n"), 0o600); err != nil {
		return err
	}
	return overlayOn(ctx, diskFile(b.snapDir), b.disk)
}

// overlayOn creates the qcow2 overlay disk over the qcow2 backing (a snapshot's or template's disk).
func overlayOn(ctx context.Context, backing, disk string) error {
	if out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", backing, disk).CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img create: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copyVolumes gives the fork its own copies of the snapshot's volumes.
func (b *boot) copyVolumes(ctx context.Context) error {
	if len(b.info.Volumes) == 0 {
		return errSkip
	}
	for _, v := range b.info.Volumes {
		dst := b.s.volumePath(b.id, v.Name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		if _, err := fsutil.CopySparse(snapVolume(b.snapDir, v.Name), dst); err != nil {
			return err
		}
		b.disks = append(b.disks, hypervisor.Disk{Path: dst, Format: "raw"})
	}
	return nil
}

// restoreVM starts a VM over the snapshot's RAM, mapped privately, and loads its device state.
func (b *boot) restoreVM(ctx context.Context) error {
	b.spec = b.machineSpec()
	b.spec.MAC = hypervisor.MACFor(b.info.ParentID)
	b.spec.RAMPath = ramFile(b.snapDir)
	vm, err := b.s.drv.Restore(ctx, b.spec, stateFile(b.snapDir))
	if err != nil {
		return err
	}
	b.running(vm)
	if vm.Accel() != b.info.Accel {
		b.killVM()
		return errdefs.Unavailable("snapshot %s was taken under %s but this host runs %s", b.snapshot, b.info.Accel, vm.Accel())
	}
	return nil
}

// children are the ids of running VMs that map the snapshot's RAM.
func (s *Service) children(name string) []string {
	ram := ramFile(s.snapshotDir(name))
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, m := range s.vms {
		if m.vm.RAMPath() == ram && !m.vm.Exited() {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

func (s *Service) snapshotChildren(ctx context.Context, r api.SnapshotName) (api.SnapshotChildrenResponse, error) {
	if err := api.CheckSnapshotName(r.Snapshot); err != nil {
		return api.SnapshotChildrenResponse{}, err
	}
	return api.SnapshotChildrenResponse{IDs: s.children(r.Snapshot)}, nil
}

// snapshotRemove deletes a snapshot. Live children are refused (they would fault on pages of a
// file that is gone); stopped children have their disk rebased onto the base image first so they
// still boot.
func (s *Service) snapshotRemove(ctx context.Context, r api.SnapshotName) (api.Empty, error) {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if err := api.CheckSnapshotName(r.Snapshot); err != nil {
		return api.Empty{}, err
	}
	dir := s.snapshotDir(r.Snapshot)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return api.Empty{}, errdefs.NotFound("no snapshot named %s on host %s", r.Snapshot, s.cfg.Host)
	}
	if ids := s.children(r.Snapshot); len(ids) > 0 {
		return api.Empty{}, errdefs.Refused("snapshot %s is in use by live sandboxes %s: remove them first (there is no --force)", r.Snapshot, strings.Join(ids, ", "))
	}
	var info api.SnapshotInfo
	if b, err := os.ReadFile(metaFile(dir)); err == nil {
		json.Unmarshal(b, &info)
	}
	dependants, _ := filepath.Glob(filepath.Join(s.cfg.Home.Sandboxes(), "*", snapshotFile))
	for _, f := range dependants {
		b, err := os.ReadFile(f)
		if err != nil || strings.TrimSpace(string(b)) != r.Snapshot {
			continue
		}
		if err := s.detach(ctx, filepath.Dir(f), info.Image); err != nil {
			return api.Empty{}, fmt.Errorf("snapshot rm %s: stopped fork %s: %w", r.Snapshot, filepath.Base(filepath.Dir(f)), err)
		}
	}
	trash, err := os.MkdirTemp(s.cfg.Home.Snapshots(), ".rm-"+r.Snapshot+"-")
	if err != nil {
		return api.Empty{}, err
	}
	if err := os.Rename(dir, filepath.Join(trash, "x")); err != nil {
		os.Remove(trash)
		return api.Empty{}, fmt.Errorf("snapshot rm %s: %w", r.Snapshot, err)
	}
	return api.Empty{}, os.RemoveAll(trash)
}

// detach rebases a stopped fork's disk overlay from the snapshot's disk onto the base image
// (qemu-img's safe rebase copies what differs), so the fork no longer needs the snapshot.
func (s *Service) detach(ctx context.Context, dir, imageName string) error {
	base, err := image.Path(s.cfg.Home, imageName)
	if err != nil {
		return err
	}
	disk := filepath.Join(dir, "disk.qcow2")
	if _, err := os.Stat(disk); err == nil {
		out, err := exec.CommandContext(ctx, "qemu-img", "rebase", "-q", "-f", "qcow2", "-F", "raw", "-b", base, disk).CombinedOutput()
		if err != nil {
			return fmt.Errorf("qemu-img rebase: %v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	return os.Remove(filepath.Join(dir, snapshotFile))
}

// snapshotList reads the snapshots on this host.
func (s *Service) snapshotList(ctx context.Context, _ api.Empty) ([]api.SnapshotInfo, error) {
	metas, _ := filepath.Glob(filepath.Join(s.cfg.Home.Snapshots(), "*", "snapshot.json"))
	out := []api.SnapshotInfo{}
	for _, p := range metas {
		if strings.HasPrefix(filepath.Base(filepath.Dir(p)), ".") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var info api.SnapshotInfo
		if json.Unmarshal(b, &info) == nil {
			if why := damage(filepath.Dir(p), info); why != "" {
				info.Unusable = "damaged: " + why
			}
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// snapshotsOfImage names ("snapshot <name>") the snapshots whose disk is backed by image.
func (s *Service) snapshotsOfImage(image string) []string {
	list, _ := s.snapshotList(context.Background(), api.Empty{})
	var out []string
	for _, info := range list {
		if info.Image == image {
			out = append(out, "snapshot "+info.Name)
		}
	}
	return out
}

// cleanSnapshotTemps removes what a crash mid-snapshot or mid-remove left behind.
func (s *Service) cleanSnapshotTemps() {
	for _, pat := range []string{".tmp-*", ".rm-*"} {
		left, _ := filepath.Glob(filepath.Join(s.cfg.Home.Snapshots(), pat))
		for _, d := range left {
			os.RemoveAll(d)
		}
	}
}

// capped keeps the first max bytes written to it and drops the rest.
type capped struct {
	strings.Builder
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); room > 0 {
		c.Builder.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
