package gateway

import "time"

// SnapshotTimeout bounds a snapshot create (the parent is stopped while RAM and disk are copied).
const SnapshotTimeout = 5 * time.Minute

// Snapshot is one record in KV nexus_snapshots (key = Name): where it lives, the machine it
// restores, and the parent's configuration a fork inherits (agent, egress, secrets, volumes).
type Snapshot struct {
	Name      string `json:"name"`
	Sandbox   string `json:"sandbox"` // the parent's name
	SandboxID string `json:"sandbox_id"`
	Host      string `json:"host"`
	Image     string `json:"image"`
	MemoryMiB int    `json:"memory_mib"`
	VCPUs     int    `json:"vcpus"`
	// CPUs, DiskBps and DiskIOPS are the parent's containment (--cpus, --disk-bps,
	// --disk-iops), which its forks keep; 0 (as in a record from before them): the defaults.
	CPUs          float64         `json:"cpus,omitempty"`
	DiskBps       int64           `json:"disk_bps,omitempty"`
	DiskIOPS      int             `json:"disk_iops,omitempty"`
	Agent         string          `json:"agent"`
	Egress        Egress          `json:"egress"`
	Secrets       []SecretBinding `json:"secrets,omitempty"`
	Volumes       []Volume        `json:"volumes,omitempty"`
	NoPortForward bool            `json:"no_port_forward,omitempty"`
	CreatedAt     time.Time       `json:"created_at"`
	RAMBytes      int64           `json:"ram_bytes"`
	RAMDataBytes  int64           `json:"ram_data_bytes"`
	StateBytes    int64           `json:"state_bytes"`
	DiskBytes     int64           `json:"disk_bytes"`
	PausedMillis  int64           `json:"paused_millis"`
}

// SnapshotView is a snapshot with the live sandboxes forked from it (ls).
type SnapshotView struct {
	Snapshot
	Children []string `json:"children,omitempty"`
	// Unusable says why no fork can start from the snapshot (its RAM file is gone, say);
	// empty when it is whole.
	Unusable string `json:"unusable,omitempty"`
}

// SnapshotCreateRequest snapshots a running (or paused) sandbox.
type SnapshotCreateRequest struct {
	Sandbox  string `json:"sandbox"`
	Snapshot string `json:"snapshot"`
}

// SnapshotRemoveRequest removes a snapshot.
type SnapshotRemoveRequest struct {
	Snapshot string `json:"snapshot"`
}

// ForkRequest boots a new sandbox Name from snapshot Source. When Source names no snapshot but a
// sandbox, that sandbox is first snapshotted as "<name>-base" (the new sandbox's short name).
type ForkRequest struct {
	Source   string            `json:"source"`
	Name     string            `json:"name"`
	Labels   map[string]string `json:"labels,omitempty"`
	Progress string            `json:"progress,omitempty"`
}

// VolumeView is one named volume and the sandbox that owns it.
type VolumeView struct {
	Sandbox   string `json:"sandbox"`
	SandboxID string `json:"sandbox_id"`
	Name      string `json:"name"`
	Guest     string `json:"guest,omitempty"`
	SizeBytes int64  `json:"size_bytes"`
	UsedBytes int64  `json:"used_bytes"`
	Host      string `json:"host"`
}

// VolumeRemoveRequest removes a stopped sandbox's volume (its data is gone for good).
type VolumeRemoveRequest struct {
	Sandbox string `json:"sandbox"`
	Volume  string `json:"volume"`
}
