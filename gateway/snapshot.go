package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/bytesize"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/failpoint"
)

// Snapshots, forks and named volumes. The vmm of the parent's host does the disk and memory work
// (services/vmm/snapshot.go); the gateway keeps the index in KV nexus_snapshots and gives every
// fork a registry record and a perimeter of its own, exactly as create does.

func (g *Service) snapshotKV(ctx context.Context) (jetstream.KeyValue, error) {
	return bus.KV(ctx, g.cfg.Bus, bus.KVSnapshots)
}

func (g *Service) getSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	if err := vmmapi.CheckSnapshotName(name); err != nil {
		return nil, err
	}
	kv, err := g.snapshotKV(ctx)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, errdefs.NotFound("no snapshot named %s", name)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshots: get %s: %w", name, err)
	}
	var s api.Snapshot
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return nil, fmt.Errorf("snapshots: record %s is damaged: %w", name, err)
	}
	return &s, nil
}

// snapshotCreate snapshots a running or paused sandbox and records it.
func (g *Service) snapshotCreate(ctx context.Context, r api.SnapshotCreateRequest) (*api.Snapshot, error) {
	return g.snapshot(ctx, r.Sandbox, r.Snapshot, "snapshot create")
}

func (g *Service) snapshot(ctx context.Context, sandbox, snap, op string) (*api.Snapshot, error) {
	if err := vmmapi.CheckSnapshotName(snap); err != nil {
		return nil, err
	}
	name, err := api.ParseName(sandbox)
	if err != nil {
		return nil, err
	}
	sb, err := g.reg.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if sb.State != api.StateRunning && sb.State != api.StatePaused {
		return nil, errdefs.Conflict("%s: sandbox %s is %s; only a running or paused sandbox can be snapshotted", op, sb.Name, sb.State)
	}
	kv, err := g.snapshotKV(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := kv.Get(ctx, snap); err == nil {
		return nil, errdefs.Conflict("snapshot %s already exists", snap)
	}
	if err := g.admit(); err != nil {
		return nil, err // a snapshot copies the guest's RAM and disk into the home
	}
	info, err := g.vmm(sb.Host).SnapshotCreate(ctx, vmmapi.SnapshotRequest{ID: sb.ID, Snapshot: snap, Op: op})
	if err != nil {
		// A stop that won the race leaves the vmm with no VM: say so in the sandbox's terms.
		if now, gerr := g.reg.Get(ctx, name); errors.Is(err, errdefs.ErrConflict) && gerr == nil &&
			now.State != api.StateRunning && now.State != api.StatePaused {
			return nil, errdefs.Conflict("%s: sandbox %s is %s; only a running or paused sandbox can be snapshotted", op, now.Name, now.State)
		}
		return nil, err
	}
	failpoint.Hit("gateway/snapshot/vm")
	rec := &api.Snapshot{
		Name: snap, Sandbox: sb.Name, SandboxID: sb.ID, Host: sb.Host, Image: sb.Image, MemoryMiB: info.MemoryMiB, VCPUs: info.VCPUs,
		CPUs: sb.CPUs, DiskBps: sb.DiskBps, DiskIOPS: sb.DiskIOPS, Agent: sb.Agent, Egress: sb.Egress, Secrets: sb.Secrets, Volumes: sb.Volumes, NoPortForward: sb.NoPortForward,
		CreatedAt: info.Created, RAMBytes: info.RAMBytes, RAMDataBytes: info.RAMDataBytes, StateBytes: info.StateBytes,
		DiskBytes: info.DiskBytes, PausedMillis: info.PausedMillis,
	}
	b, _ := json.Marshal(rec)
	kctx, cancel := bus.StoreContext(ctx)
	_, err = kv.Create(kctx, snap, b)
	cancel()
	if err != nil {
		// Keep disk and index in step: without a record the snapshot is removed again.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		g.vmm(sb.Host).SnapshotRemove(rctx, snap)
		cancel()
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, errdefs.Conflict("snapshot %s already exists", snap)
		}
		return nil, fmt.Errorf("snapshots: record %s: %w", snap, bus.StoreError(err, string(g.cfg.Home)))
	}
	return rec, nil
}

// snapshotList lists the recorded snapshots with their live children.
func (g *Service) snapshotList(ctx context.Context, _ api.Empty) ([]api.SnapshotView, error) {
	kv, err := g.snapshotKV(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshots: list: %w", err)
	}
	defer lister.Stop()
	names := g.idNames(ctx)
	out := []api.SnapshotView{}
	onHost := map[string]map[string]vmmapi.SnapshotInfo{} // what each host's vmm holds; nil: no answer
	for key := range lister.Keys() {
		rec, err := g.getSnapshot(ctx, key)
		if err != nil {
			continue
		}
		v := api.SnapshotView{Snapshot: *rec}
		held, asked := onHost[rec.Host]
		if !asked {
			held = g.hostSnapshots(ctx, rec.Host)
			onHost[rec.Host] = held
		}
		if info, ok := held[rec.Name]; held != nil && !ok {
			v.Unusable = "its files are gone from host " + rec.Host
		} else if ok {
			v.Unusable = info.Unusable
		}
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if ids, err := g.vmm(rec.Host).SnapshotChildren(lctx, rec.Name); err == nil {
			v.Children = childNames(ids, names)
		}
		cancel()
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// idNames maps sandbox ids to names.
func (g *Service) idNames(ctx context.Context) map[string]string {
	names := map[string]string{}
	if all, err := g.reg.List(ctx, nil); err == nil {
		for _, sb := range all {
			names[sb.ID] = sb.Name
		}
	}
	return names
}

func childNames(ids []string, names map[string]string) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if n, ok := names[id]; ok {
			out = append(out, n)
		} else {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// snapshotRemove deletes a snapshot unless live sandboxes were forked from it.
func (g *Service) snapshotRemove(ctx context.Context, r api.SnapshotRemoveRequest) (api.Empty, error) {
	rec, err := g.getSnapshot(ctx, r.Snapshot)
	if err != nil {
		return api.Empty{}, err
	}
	ids, err := g.vmm(rec.Host).SnapshotChildren(ctx, rec.Name)
	if err != nil {
		return api.Empty{}, err
	}
	if len(ids) > 0 {
		return api.Empty{}, errdefs.Refused("snapshot %s is in use by live sandboxes %s: remove them first (there is no --force)",
			rec.Name, strings.Join(childNames(ids, g.idNames(ctx)), ", "))
	}
	if err := g.vmm(rec.Host).SnapshotRemove(ctx, rec.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		if errors.Is(err, errdefs.ErrRefused) {
			// A fork started in between: name it the way the user knows it.
			if ids, cerr := g.vmm(rec.Host).SnapshotChildren(ctx, rec.Name); cerr == nil && len(ids) > 0 {
				return api.Empty{}, errdefs.Refused("snapshot %s is in use by live sandboxes %s: remove them first (there is no --force)",
					rec.Name, strings.Join(childNames(ids, g.idNames(ctx)), ", "))
			}
		}
		return api.Empty{}, err
	}
	kv, err := g.snapshotKV(ctx)
	if err != nil {
		return api.Empty{}, err
	}
	kctx, cancel := bus.StoreContext(ctx)
	err = kv.Purge(kctx, rec.Name)
	cancel()
	if err != nil {
		return api.Empty{}, fmt.Errorf("snapshots: delete %s: %w", rec.Name, bus.StoreError(err, string(g.cfg.Home)))
	}
	return api.Empty{}, nil
}

// fork creates a sandbox from a snapshot: a new record and id, its own perimeter (placeholders,
// network, MITM policy) with the parent's egress configuration, and a VM restored from the
// snapshot's memory. A damaged snapshot or a refused source leaves nothing behind.
func (g *Service) fork(ctx context.Context, r api.ForkRequest) (*api.Sandbox, error) {
	name, err := api.ParseName(r.Name)
	if err != nil {
		return nil, err
	}
	if err := api.ValidateLabels(r.Labels); err != nil {
		return nil, err
	}
	if _, err := g.reg.Get(ctx, name); err == nil {
		return nil, errdefs.Conflict("sandbox %s already exists", name)
	}
	if err := g.admit(); err != nil {
		return nil, err
	}
	rec, err := g.getSnapshot(ctx, r.Source)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) {
		// Not a snapshot: a sandbox to snapshot first?
		src, perr := api.ParseName(r.Source)
		if perr != nil {
			return nil, err
		}
		if _, gerr := g.reg.Get(ctx, src); gerr != nil {
			return nil, errdefs.NotFound("no snapshot or sandbox named %s", r.Source)
		}
		rec, err = g.snapshot(ctx, src, hostname(name)+"-base", "fork")
	}
	if err != nil {
		return nil, err
	}
	sb := &api.Sandbox{ID: NewID(), Name: name, Labels: r.Labels, Image: rec.Image, MemoryMiB: rec.MemoryMiB, VCPUs: rec.VCPUs,
		CPUs: rec.CPUs, DiskBps: rec.DiskBps, DiskIOPS: rec.DiskIOPS, Agent: rec.Agent, Egress: rec.Egress, Secrets: rec.Secrets, Volumes: rec.Volumes, NoPortForward: rec.NoPortForward, Host: rec.Host,
		Fork: rec.Name}
	if err := g.reg.Create(ctx, sb); err != nil {
		return nil, err
	}
	failpoint.Hit("gateway/fork/recorded")
	if err := g.bootFork(ctx, sb, rec.Name, r.Progress); err != nil {
		if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrRefused) || errors.Is(err, errdefs.ErrNotFound) {
			// Refused before any VM started (a damaged snapshot, say): leave nothing behind.
			g.discard(ctx, sb)
			return nil, err
		}
		return sb, err
	}
	return sb, nil
}

// bootFork is boot for a fork: the same perimeter steps, then the vmm restores instead of booting.
func (g *Service) bootFork(ctx context.Context, sb *api.Sandbox, snap, progress string) error {
	perim, err := g.startBoot(ctx, sb)
	if err != nil {
		return err
	}
	if len(perim.mounts) > 0 {
		// The restored machine has exactly the parent's devices, and the parent had no mounts.
		g.log.Info().Str("sandbox", sb.Name).Msg("fork: the profile's live credential mount is not attached to a fork")
	}
	req := vmmapi.ForkRequest{ID: sb.ID, Name: sb.Name, Snapshot: snap, Hostname: hostname(sb.Name), Env: perim.env,
		NetSocket: perim.netSocket, NoPortForward: sb.NoPortForward, Progress: progress,
		CPUs: sb.CPUs, DiskBps: sb.DiskBps, DiskIOPS: sb.DiskIOPS}
	if err := g.whileBooting(ctx, sb.ID, func(ctx context.Context) error {
		_, err := g.vmm(sb.Host).Fork(ctx, req)
		return err
	}); err != nil {
		if errors.As(err, new(errHostLost)) {
			return err // failed already; settled when the host is back (checkHosts)
		}
		g.teardownPerimeter(context.WithoutCancel(ctx), sb)
		g.fail(sb, err)
		return err
	}
	failpoint.Hit("gateway/fork/vm")
	return g.reg.Transition(ctx, sb, api.StateRunning, "", nil)
}

var volumeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// parseNamedMounts parses --mount-named NAME:GUEST[,kind=disk][,size=SIZE].
func parseNamedMounts(specs []string) ([]api.Volume, error) {
	var out []api.Volume
	seen := map[string]bool{}
	for _, s := range specs {
		main, opts, _ := strings.Cut(s, ",")
		n, guest, ok := strings.Cut(main, ":")
		if !ok || !volumeNameRE.MatchString(n) || !strings.HasPrefix(guest, "/") || strings.ContainsAny(guest, ":\n") {
			return nil, errdefs.Invalid("invalid --mount-named %q: use NAME:/guest/path[,kind=disk][,size=SIZE] (NAME: 1-63 of a-z 0-9 - _)", s)
		}
		v := api.Volume{Name: n, Guest: guest, SizeMiB: api.DefaultVolumeMiB}
		for _, o := range strings.Split(opts, ",") {
			if size, ok := strings.CutPrefix(o, "size="); ok {
				mib, err := bytesize.ParseMiB(size)
				if err != nil || mib < MinVolumeMiB || mib > api.MaxDiskMiB {
					return nil, errdefs.Invalid("invalid --mount-named %q: size must be %d MiB to %d TiB, as in size=2g", s, MinVolumeMiB, api.MaxDiskMiB>>20)
				}
				v.SizeMiB = mib
				continue
			}
			if o != "" && o != "kind=disk" {
				return nil, errdefs.Invalid("invalid --mount-named %q: the options are kind=disk and size=SIZE", s)
			}
		}
		if seen[n] {
			return nil, errdefs.Invalid("invalid --mount-named %q: volume %s is named twice", s, n)
		}
		seen[n] = true
		out = append(out, v)
	}
	return out, nil
}

// MinVolumeMiB is the smallest named volume: ext4's journal and metadata need room.
const MinVolumeMiB = 16

func vmmVolumes(vs []api.Volume) []vmmapi.Volume {
	var out []vmmapi.Volume
	for _, v := range vs {
		out = append(out, vmmapi.Volume{Name: v.Name, Guest: v.Guest, SizeMiB: v.SizeMiB})
	}
	return out
}

// volumeList lists the named volumes of every host that has sandboxes.
func (g *Service) volumeList(ctx context.Context, _ api.Empty) ([]api.VolumeView, error) {
	all, err := g.reg.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	byID := map[string]*api.Sandbox{}
	hosts := map[string]bool{g.cfg.Host: true}
	for _, sb := range all {
		byID[sb.ID] = sb
		hosts[sb.Host] = true
	}
	out := []api.VolumeView{}
	for h := range hosts {
		list, err := g.vmm(h).Volumes(ctx)
		if err != nil {
			continue
		}
		for _, v := range list {
			vv := api.VolumeView{SandboxID: v.SandboxID, Name: v.Name, SizeBytes: v.SizeBytes, UsedBytes: v.UsedBytes, Host: h}
			if sb := byID[v.SandboxID]; sb != nil {
				vv.Sandbox = sb.Name
				for _, x := range sb.Volumes {
					if x.Name == v.Name {
						vv.Guest = x.Guest
					}
				}
			}
			out = append(out, vv)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Sandbox != out[j].Sandbox {
			return out[i].Sandbox < out[j].Sandbox
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// volumeRemove deletes a stopped sandbox's volume and drops it from the record.
func (g *Service) volumeRemove(ctx context.Context, r api.VolumeRemoveRequest) (api.Empty, error) {
	name, err := api.ParseName(r.Sandbox)
	if err != nil {
		return api.Empty{}, err
	}
	sb, err := g.reg.Get(ctx, name)
	if err != nil {
		return api.Empty{}, err
	}
	switch sb.State {
	case api.StateRunning, api.StatePaused, api.StateStarting, api.StateStopping:
		return api.Empty{}, errdefs.Conflict("volume %s of sandbox %s is in use (the sandbox is %s): stop it first", r.Volume, sb.Name, sb.State)
	}
	if err := g.vmm(sb.Host).VolumeRemove(ctx, vmmapi.VolumeRequest{SandboxID: sb.ID, Name: r.Volume}); err != nil {
		return api.Empty{}, err
	}
	var keep []api.Volume
	for _, v := range sb.Volumes {
		if v.Name != r.Volume {
			keep = append(keep, v)
		}
	}
	if len(keep) != len(sb.Volumes) {
		sb.Volumes = keep
		if err := g.reg.Update(ctx, sb); err != nil {
			return api.Empty{}, err
		}
	}
	return api.Empty{}, nil
}
