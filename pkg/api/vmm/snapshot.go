package vmm

import (
	"context"
	"regexp"
	"time"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// SnapshotTimeout bounds a snapshot: the guest is stopped while its RAM and disk are copied.
const SnapshotTimeout = 5 * time.Minute

// Volume is a named per-sandbox virtio-blk disk (ext4) mounted at Guest.
type Volume struct {
	Name    string `json:"name"`
	Guest   string `json:"guest"`
	SizeMiB int    `json:"size_mib,omitempty"` // size of a new image; default 8192 (sparse)
}

// SnapshotRequest snapshots the running VM of sandbox ID under Snapshot.
type SnapshotRequest struct {
	ID       string `json:"id"`
	Snapshot string `json:"snapshot"`
	// Op names the user's operation in refusals ("snapshot create" or "fork").
	Op string `json:"op,omitempty"`
}

// SnapshotInfo is what the vmm stores with a snapshot (snapshot.json in its directory).
type SnapshotInfo struct {
	Name      string   `json:"name"`
	Host      string   `json:"host"`
	ParentID  string   `json:"parent_id"`
	Image     string   `json:"image"`
	MemoryMiB int      `json:"memory_mib"`
	VCPUs     int      `json:"vcpus"`
	Accel     string   `json:"accel"`
	Net       bool     `json:"net"` // the VM has a NIC: a fork needs a network socket
	Volumes   []Volume `json:"volumes,omitempty"`
	// Mounts are the parent's remountable 9p mounts, in device order: a fork gets the same
	// devices and mounts them again.
	Mounts        []Mount   `json:"mounts,omitempty"`
	RAMBytes      int64     `json:"ram_bytes"`
	RAMDataBytes  int64     `json:"ram_data_bytes"` // of RAMBytes, how much was touched (copied)
	StateBytes    int64     `json:"state_bytes"`
	DiskBytes     int64     `json:"disk_bytes"`
	KernelVersion string    `json:"kernel_version,omitempty"`
	Created       time.Time `json:"created"`
	// PausedMillis is how long the parent's vCPUs stood still for the snapshot.
	PausedMillis int64 `json:"paused_millis"`
	// Unusable, in a list, says why no fork can start from the snapshot (a file missing or of
	// the wrong length); empty when it is whole.
	Unusable string `json:"unusable,omitempty"`
}

// SnapshotName names a snapshot.
type SnapshotName struct {
	Snapshot string `json:"snapshot"`
}

// SnapshotChildrenResponse are the sandboxes (ids) whose running VMs map a snapshot's RAM.
type SnapshotChildrenResponse struct {
	IDs []string `json:"ids"`
}

// ForkRequest boots a new sandbox's VM from a snapshot; the fields mean what they mean in
// StartRequest. The machine (memory, vCPUs, devices) is the snapshot's.
type ForkRequest struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	Snapshot      string            `json:"snapshot"`
	Hostname      string            `json:"hostname"`
	Env           map[string]string `json:"env,omitempty"`
	NetSocket     string            `json:"net_socket,omitempty"`
	NoPortForward bool              `json:"no_port_forward,omitempty"`
	Progress      string            `json:"progress,omitempty"`
	// CPUs, DiskBps and DiskIOPS are the fork's containment, as in StartRequest: the parent's.
	CPUs     float64 `json:"cpus,omitempty"`
	DiskBps  int64   `json:"disk_bps,omitempty"`
	DiskIOPS int     `json:"disk_iops,omitempty"`
}

// VolumeInfo is one named volume image on a host.
type VolumeInfo struct {
	SandboxID string `json:"sandbox_id"`
	Name      string `json:"name"`
	SizeBytes int64  `json:"size_bytes"` // apparent size
	UsedBytes int64  `json:"used_bytes"` // blocks allocated on the host
	Path      string `json:"path"`
}

// VolumeRequest names one volume of one sandbox.
type VolumeRequest struct {
	SandboxID string `json:"sandbox_id"`
	Name      string `json:"name"`
}

func (c *Client) SnapshotCreate(ctx context.Context, r SnapshotRequest) (SnapshotInfo, error) {
	return SnapshotCreate.Call(ctx, c.nc, c.host, r)
}
func (c *Client) SnapshotRemove(ctx context.Context, name string) error {
	_, err := SnapshotRemove.Call(ctx, c.nc, c.host, SnapshotName{Snapshot: name})
	return err
}
func (c *Client) SnapshotChildren(ctx context.Context, name string) ([]string, error) {
	r, err := SnapshotChildren.Call(ctx, c.nc, c.host, SnapshotName{Snapshot: name})
	return r.IDs, err
}
func (c *Client) Snapshots(ctx context.Context) ([]SnapshotInfo, error) {
	return SnapshotList.Call(ctx, c.nc, c.host, Empty{})
}
func (c *Client) Fork(ctx context.Context, r ForkRequest) (StartResponse, error) {
	return Fork.Call(ctx, c.nc, c.host, r)
}
func (c *Client) Volumes(ctx context.Context) ([]VolumeInfo, error) {
	return VolumeList.Call(ctx, c.nc, c.host, Empty{})
}
func (c *Client) VolumeRemove(ctx context.Context, r VolumeRequest) error {
	_, err := VolumeRemove.Call(ctx, c.nc, c.host, r)
	return err
}

var snapshotNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// CheckSnapshotName validates a snapshot name: 1-63 of a-z 0-9 _ -, starting with a letter or digit.
func CheckSnapshotName(name string) error {
	if !snapshotNameRe.MatchString(name) {
		return errdefs.Invalid("invalid snapshot name %q: use 1-63 of a-z 0-9 - _ starting with a letter or digit", name)
	}
	return nil
}
