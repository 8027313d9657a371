package vmm

import "time"

// Templates (services/vmm/template.go): per shape (image, memory, vCPUs, disk size, NIC or
// none, number of live shares) a VM booted to "agent ready" and saved, which a create restores
// instead of booting. A template holds no secret, placeholder, CA or user mount: those are given
// at restore, as to a cold boot.

// TemplateInfo describes one template.
type TemplateInfo struct {
	Key       string `json:"key"` // hash of the shape and of what it was built from (kernel, initramfs and agent, QEMU, nexus)
	Image     string `json:"image"`
	MemoryMiB int    `json:"memory_mib"`
	VCPUs     int    `json:"vcpus"`
	DiskMiB   int    `json:"disk_mib,omitempty"` // 0: the image's size
	Net       bool   `json:"net"`
	// Shares is how many remountable 9p shares (the agent profile's live credential mount) its
	// VM has: a restore mounts the sandbox's own there.
	Shares       int       `json:"shares,omitempty"`
	RAMDataBytes int64     `json:"ram_data_bytes"`
	DiskBytes    int64     `json:"disk_bytes"`
	BuildMillis  int64     `json:"build_millis"`
	Created      time.Time `json:"created"`
	// Stale says the template was built from another kernel, agent, QEMU, nexus or image build
	// than this host's: no create uses it, and it is removed once nothing depends on it.
	Stale bool `json:"stale,omitempty"`
}
