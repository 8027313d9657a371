package vmm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/guest"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// Named volumes (DESIGN §4): one sparse ext4 image per sandbox and name under
// $NEXUS_HOME/volumes/<sandbox-id>/<name>.ext4, attached as a virtio-blk disk with serial
// nexus-disk<i> and mounted by the agent at the guest path. An image is created on first boot and
// reused on every later one, so its contents survive stop/start.

// DefaultVolumeMiB is the size of a new volume image (sparse: it costs only what is written).
const DefaultVolumeMiB = 8192

var volumeNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func (s *Service) volumeDir(id string) string { return filepath.Join(s.cfg.Home.Volumes(), id) }

func (s *Service) volumePath(id, name string) string {
	return filepath.Join(s.volumeDir(id), name+".ext4")
}

// attachVolumes creates missing volume images and returns their disks, in order.
func (s *Service) attachVolumes(ctx context.Context, id string, vols []api.Volume) ([]hypervisor.Disk, error) {
	var disks []hypervisor.Disk
	seen := map[string]bool{}
	for _, v := range vols {
		if !volumeNameRe.MatchString(v.Name) || seen[v.Name] {
			return nil, errdefs.Invalid("volume name %q must be unique, 1-63 of a-z 0-9 _ -", v.Name)
		}
		seen[v.Name] = true
		p := s.volumePath(id, v.Name)
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			if err := makeVolume(ctx, p, v.SizeMiB); err != nil {
				return nil, err
			}
		} else if err != nil {
			return nil, err
		}
		disks = append(disks, hypervisor.Disk{Path: p, Format: "raw"})
	}
	return disks, nil
}

// makeVolume writes a sparse ext4 image atomically (temp file + rename).
func makeVolume(ctx context.Context, path string, sizeMiB int) error {
	if sizeMiB <= 0 {
		sizeMiB = DefaultVolumeMiB
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(sizeMiB) << 20)
	f.Close()
	if err != nil {
		os.Remove(tmp)
		return err
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-L", "nexus-vol", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("volume %s: mkfs.ext4: %v: %s", filepath.Base(path), err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, path)
}

// mountScript finds the virtio-blk disk by serial and mounts it.
const mountScript = `dev=; for d in /sys/block/*; do [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ] && dev=/dev/${d##*/}; done
[ -n "$dev" ] || { echo "no disk with serial $1"; exit 1; }
mkdir -p "$2" && mount -t ext4 "$dev" "$2"`

// mountVolumes mounts the volumes attached by attachVolumes (disks nexus-disk0, 1, …).
func mountVolumes(ctx context.Context, agent *guest.Client, vols []api.Volume) error {
	for i, v := range vols {
		if !strings.HasPrefix(v.Guest, "/") {
			return errdefs.Invalid("volume %s: guest path %q must be absolute", v.Name, v.Guest)
		}
		out := &capped{max: 512}
		st, err := agent.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", mountScript, "sh", fmt.Sprintf("nexus-disk%d", i), v.Guest}}, nil, out, out, nil)
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		if st.Code != 0 {
			return fmt.Errorf("volume %s at %s: %s", v.Name, v.Guest, strings.Join(strings.Fields(strings.ToValidUTF8(out.String(), "?")), " "))
		}
	}
	return nil
}

// volumes lists every volume image on this host.
func (s *Service) volumes(ctx context.Context, _ api.Empty) ([]api.VolumeInfo, error) {
	paths, _ := filepath.Glob(filepath.Join(s.cfg.Home.Volumes(), "*", "*.ext4"))
	out := []api.VolumeInfo{}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		vi := api.VolumeInfo{SandboxID: filepath.Base(filepath.Dir(p)), Name: strings.TrimSuffix(filepath.Base(p), ".ext4"), SizeBytes: fi.Size(), Path: p}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			vi.UsedBytes = st.Blocks * 512
		}
		out = append(out, vi)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].SandboxID != out[j].SandboxID {
			return out[i].SandboxID < out[j].SandboxID
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// volumeRemove deletes one volume image; a running VM's volume is refused.
func (s *Service) volumeRemove(ctx context.Context, r api.VolumeRequest) (api.Empty, error) {
	if !volumeNameRe.MatchString(r.Name) || !sandboxIDRe.MatchString(r.SandboxID) {
		return api.Empty{}, errdefs.Invalid("volume %q of sandbox %q: bad name", r.Name, r.SandboxID)
	}
	s.mu.Lock()
	_, running := s.vms[r.SandboxID]
	s.mu.Unlock()
	if running {
		return api.Empty{}, errdefs.Conflict("volume %s is attached to a running sandbox: stop it first", r.Name)
	}
	p := s.volumePath(r.SandboxID, r.Name)
	if err := os.Remove(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return api.Empty{}, errdefs.NotFound("no volume %s", r.Name)
		}
		return api.Empty{}, err
	}
	os.Remove(s.volumeDir(r.SandboxID)) // only if now empty
	return api.Empty{}, nil
}

var sandboxIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
