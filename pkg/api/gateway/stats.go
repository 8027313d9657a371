package gateway

import (
	"context"
	"time"

	"github.com/IniZio/nexus/pkg/bus"
)

// Stats reports what running sandboxes use now (`nexus stats`).
var Stats = bus.Endpoint[StatsRequest, []SandboxStats]{Scope: bus.GatewayAPI, Verb: "sandbox.stats"}

// StatsRequest names sandboxes, or selects them by label; neither means every running one.
type StatsRequest struct {
	Names    []string `json:"names,omitempty"`
	Selector []string `json:"selector,omitempty"`
}

// SandboxStats is one sample of a sandbox's use. CPU is a running total: a rate needs two
// samples (CPUPercent, which `nexus stats` fills from two).
type SandboxStats struct {
	Name  string    `json:"name"`
	ID    string    `json:"id"`
	State State     `json:"state"`
	Time  time.Time `json:"time"`
	// CPUSeconds is the host CPU time its VM has used; CPUPercent the share of one core it used
	// between two samples.
	CPUSeconds float64 `json:"cpu_seconds"`
	CPUPercent float64 `json:"cpu_percent"`
	VCPUs      int     `json:"vcpus"`
	// GuestCPUBusy and GuestCPUTotal are the guest kernel's own CPU ticks (busy, all) at its
	// last heartbeat; zero from an older guest agent.
	GuestCPUBusy  uint64 `json:"guest_cpu_busy,omitempty"`
	GuestCPUTotal uint64 `json:"guest_cpu_total,omitempty"`
	// MemoryMiB is the guest's memory (its limit); GuestMemUsedBytes what the guest uses of it
	// (MemTotal - MemAvailable, zero from an older guest agent); RSSBytes what its VM holds of
	// the host's.
	MemoryMiB         int   `json:"memory_mib"`
	GuestMemUsedBytes int64 `json:"guest_mem_used_bytes"`
	RSSBytes          int64 `json:"rss_bytes"`
	// DiskUsedBytes is what its root disk takes on the host; DiskSizeBytes what the guest sees.
	DiskUsedBytes int64 `json:"disk_used_bytes"`
	DiskSizeBytes int64 `json:"disk_size_bytes"`
	// NetOutBytes and NetInBytes are what its NIC sent and received; Connections the forwarded
	// connections open now.
	NetOutBytes uint64 `json:"net_out_bytes"`
	NetInBytes  uint64 `json:"net_in_bytes"`
	Connections int    `json:"connections"`
	// Execs counts the commands running in it now (exec, attach).
	Execs int `json:"execs"`
}

// Stats samples the sandboxes r names.
func (c *Client) Stats(ctx context.Context, r StatsRequest) ([]SandboxStats, error) {
	return Stats.Call(ctx, c.nc, "", r)
}
