// Package vmm is the contract of the vmm service: subjects, request and response types and a
// typed client. The gateway is its only caller for lifecycle verbs.
package vmm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/pkg/bus"
)

// Endpoints, on nexus.vmm.<host>.<verb>.
var (
	Start   = bus.Endpoint[StartRequest, StartResponse]{Scope: bus.VMMAPI, Verb: "start"}
	Stop    = bus.Endpoint[IDRequest, Empty]{Scope: bus.VMMAPI, Verb: "stop"}
	Pause   = bus.Endpoint[IDRequest, Empty]{Scope: bus.VMMAPI, Verb: "pause"}
	Resume  = bus.Endpoint[IDRequest, Empty]{Scope: bus.VMMAPI, Verb: "resume"}
	Remove  = bus.Endpoint[IDRequest, Empty]{Scope: bus.VMMAPI, Verb: "remove"}
	Inspect = bus.Endpoint[IDRequest, VMInfo]{Scope: bus.VMMAPI, Verb: "inspect"}
	List    = bus.Endpoint[Empty, []VMInfo]{Scope: bus.VMMAPI, Verb: "list"}
	Exec    = bus.Endpoint[ExecRequest, Empty]{Scope: bus.VMMAPI, Verb: "exec"}
	Copy    = bus.Endpoint[CopyRequest, Empty]{Scope: bus.VMMAPI, Verb: "copy"}
	Logs    = bus.Endpoint[LogsRequest, LogsResponse]{Scope: bus.VMMAPI, Verb: "logs"}
	Images  = bus.Endpoint[Empty, []ImageInfo]{Scope: bus.VMMAPI, Verb: "images"}
	Image   = bus.Endpoint[ImageRequest, ImageInfo]{Scope: bus.VMMAPI, Verb: "image"}

	SnapshotCreate   = bus.Endpoint[SnapshotRequest, SnapshotInfo]{Scope: bus.VMMAPI, Verb: "snapshot.create"}
	SnapshotRemove   = bus.Endpoint[SnapshotName, Empty]{Scope: bus.VMMAPI, Verb: "snapshot.remove"}
	SnapshotChildren = bus.Endpoint[SnapshotName, SnapshotChildrenResponse]{Scope: bus.VMMAPI, Verb: "snapshot.children"}
	SnapshotList     = bus.Endpoint[Empty, []SnapshotInfo]{Scope: bus.VMMAPI, Verb: "snapshot.list"}
	Fork             = bus.Endpoint[ForkRequest, StartResponse]{Scope: bus.VMMAPI, Verb: "fork"}
	VolumeList       = bus.Endpoint[Empty, []VolumeInfo]{Scope: bus.VMMAPI, Verb: "volume.list"}
	VolumeRemove     = bus.Endpoint[VolumeRequest, Empty]{Scope: bus.VMMAPI, Verb: "volume.remove"}
)

// Endpoints lists every endpoint of the contract (the bus tests check their permissions).
var Endpoints = []bus.Route{
	Start, Stop, Pause, Resume, Remove, Inspect, List, Exec, Copy, Logs, Images, Image,
	SnapshotCreate, SnapshotRemove, SnapshotChildren, SnapshotList, Fork, VolumeList, VolumeRemove,
}

// Mount shares a host directory into the guest over virtio-9p.
type Mount struct {
	Host     string `json:"host"`
	Guest    string `json:"guest"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Remount marks a mount the vmm may drop in the guest for a snapshot and mount again after,
	// in the parent and in every fork (the agent profile's credential directory): it does not
	// stand in the way of snapshots the way a user's --mount does.
	Remount bool `json:"remount,omitempty"`
}

// StartRequest boots (or re-boots after a stop) the VM of one sandbox.
type StartRequest struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Image     string  `json:"image"`
	MemoryMiB int     `json:"memory_mib"`
	VCPUs     int     `json:"vcpus"`
	CPUs      float64 `json:"cpus,omitempty"` // host CPU quota in CPUs; 0: VCPUs
	// DiskMiB is the size of a new root disk (the overlay's virtual size, which the guest's root
	// file system grows to); 0: the image's own size. An existing disk keeps its size.
	DiskMiB int `json:"disk_mib,omitempty"`
	// DiskBps and DiskIOPS bound the VM's disk I/O (each direction, its disks together) per
	// second; 0: the vmm's defaults.
	DiskBps   int64             `json:"disk_bps,omitempty"`
	DiskIOPS  int               `json:"disk_iops,omitempty"`
	Hostname  string            `json:"hostname"`
	Env       map[string]string `json:"env,omitempty"` // applied to every exec; may hold placeholders
	Mounts    []Mount           `json:"mounts,omitempty"`
	Volumes   []Volume          `json:"volumes,omitempty"`    // named virtio-blk volumes (volumes.go)
	NetSocket string            `json:"net_socket,omitempty"` // netstack's unix socket; empty: no NIC at all
	// NoPortForward keeps guest listeners from being published to the port forwarder.
	NoPortForward bool `json:"no_port_forward,omitempty"`
	// Files are written into the guest before it is reported ready.
	Files []File `json:"files,omitempty"`
	// TrustCA is a PEM certificate the guest must trust (the MITM's CA): written to CAPath and
	// added to the guest's system trust store.
	TrustCA []byte `json:"trust_ca,omitempty"`
	// Progress, when set, is a stream session id (stream.NewID): one Step message per boot
	// step goes to its .out on the vmm's host as the step finishes (stream.Follow follows it).
	Progress string `json:"progress,omitempty"`
	// Cold boots a new sandbox even when a template of its shape exists (`nexus create --cold`).
	Cold bool `json:"cold,omitempty"`
}

// CAPath is where the guest finds the trusted MITM CA.
const CAPath = "/etc/nexus/ca.pem"

// File is a small file placed in the guest at boot.
type File struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
	Data []byte `json:"data"`
}

// Step is one named boot step and how long it took.
type Step struct {
	Name   string `json:"name"`
	Millis int64  `json:"millis"`
	Done   bool   `json:"done,omitempty"`
}

// StartResponse says how the VM came up.
type StartResponse struct {
	PID   int    `json:"pid"`
	Accel string `json:"accel"`
	Steps []Step `json:"steps"`
	// Template is the key of the template the VM was restored from; empty: it booted cold.
	Template string `json:"template,omitempty"`
	// ColdReason says why a new sandbox booted cold (no template yet, --cold, a --mount…).
	ColdReason string `json:"cold_reason,omitempty"`
}

// IDRequest names one sandbox's VM.
type IDRequest struct {
	ID    string `json:"id"`
	Force bool   `json:"force,omitempty"`
}

// VMInfo is what the vmm knows of one VM.
type VMInfo struct {
	ID       string `json:"id"`
	Running  bool   `json:"running"`
	Paused   bool   `json:"paused"`
	PID      int    `json:"pid,omitempty"`
	RSSBytes int64  `json:"rss_bytes,omitempty"`
	// CPUSeconds is the host CPU time the VM's process has used (user and system).
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	// GuestCPUBusy and GuestCPUTotal are the guest kernel's busy and total CPU ticks at its last
	// heartbeat (zero from an older agent): its own load, apart from what emulating it costs.
	GuestCPUBusy  uint64 `json:"guest_cpu_busy,omitempty"`
	GuestCPUTotal uint64 `json:"guest_cpu_total,omitempty"`
	// GuestMemUsedBytes is the guest's memory in use (MemTotal - MemAvailable) at its last
	// heartbeat; zero from an older agent.
	GuestMemUsedBytes int64 `json:"guest_mem_used_bytes,omitempty"`
	// Execs counts the commands running in the guest now.
	Execs int `json:"execs,omitempty"`
	// DiskUsedBytes is what the root disk's overlay takes on the host; DiskSizeBytes the size
	// the guest sees.
	DiskUsedBytes int64     `json:"disk_used_bytes,omitempty"`
	DiskSizeBytes int64     `json:"disk_size_bytes,omitempty"`
	Started       time.Time `json:"started,omitzero"`
	Failed        string    `json:"failed,omitempty"` // why the VM is gone or unhealthy
	// Containment says how the VM's hypervisor is contained: "contained", or "less contained: …"
	// or "not contained: …" with the reason (issue 19).
	Containment string `json:"containment,omitempty"`
	// DiskErrors counts the disk errors handed to the guest (werror=report), e.g. a full host disk.
	DiskErrors int `json:"disk_errors,omitempty"`
}

// Empty is the request or response of endpoints that carry nothing.
type Empty struct{}

// Client calls the vmm of one host.
type Client struct {
	nc   *nats.Conn
	host string
}

// NewClient returns a client for the vmm on host.
func NewClient(nc *nats.Conn, host string) *Client { return &Client{nc: nc, host: host} }

func (c *Client) Start(ctx context.Context, r StartRequest) (StartResponse, error) {
	return Start.Call(ctx, c.nc, c.host, r)
}
func (c *Client) Stop(ctx context.Context, id string, force bool) error {
	_, err := Stop.Call(ctx, c.nc, c.host, IDRequest{ID: id, Force: force})
	return err
}
func (c *Client) Pause(ctx context.Context, id string) error {
	_, err := Pause.Call(ctx, c.nc, c.host, IDRequest{ID: id})
	return err
}
func (c *Client) Resume(ctx context.Context, id string) error {
	_, err := Resume.Call(ctx, c.nc, c.host, IDRequest{ID: id})
	return err
}
func (c *Client) Remove(ctx context.Context, id string) error {
	_, err := Remove.Call(ctx, c.nc, c.host, IDRequest{ID: id, Force: true})
	return err
}
func (c *Client) Inspect(ctx context.Context, id string) (VMInfo, error) {
	return Inspect.Call(ctx, c.nc, c.host, IDRequest{ID: id})
}
func (c *Client) List(ctx context.Context) ([]VMInfo, error) {
	return List.Call(ctx, c.nc, c.host, Empty{})
}

// ExecRequest starts a process in a sandbox; its I/O flows on stream session SID
// (pkg/stream), which the caller opened before asking.
type ExecRequest struct {
	ID      string   `json:"id"`
	SID     string   `json:"sid"`
	Argv    []string `json:"argv"`
	Env     []string `json:"env,omitempty"`
	Dir     string   `json:"dir,omitempty"`
	TTY     bool     `json:"tty,omitempty"`
	Rows    uint16   `json:"rows,omitempty"`
	Cols    uint16   `json:"cols,omitempty"`
	Stdin   bool     `json:"stdin,omitempty"`
	User    string   `json:"user,omitempty"`
	Timeout string   `json:"timeout,omitempty"` // Go duration; the process is killed when it passes
}

// Exit is the last message of an exec stream (kind exit).
type Exit struct {
	// Code is the command's status, 124 after its timeout, or ExitNexusFailed when nexus
	// failed and the command's own status is unknown.
	Code   int    `json:"code"`
	Signal int    `json:"signal,omitempty"`
	Error  string `json:"error,omitempty"`
}

// ExitNexusFailed is the status of an exec that nexus could not carry to its end (as in
// docker): never the guest command's own.
const ExitNexusFailed = 125

// Resize is a terminal size change (kind resize).
type Resize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// CopyRequest moves one file between host and guest on stream session SID: to the guest the
// caller writes the bytes as stdin then stdin-close; from the guest the vmm writes them as stdout.
type CopyRequest struct {
	ID      string `json:"id"`
	SID     string `json:"sid"`
	ToGuest bool   `json:"to_guest"`
	Path    string `json:"path"`
	Mode    uint32 `json:"mode,omitempty"`
	Size    int64  `json:"size,omitempty"`
}

// LogsRequest reads a sandbox's console log from Offset (a cursor returned by the last call).
type LogsRequest struct {
	ID     string `json:"id"`
	Offset int64  `json:"offset"`
	Max    int    `json:"max,omitempty"` // at most this many bytes (default and cap 1 MiB)
	Agent  bool   `json:"agent,omitempty"`
}

// LogsResponse is a chunk of log and the cursor to continue from.
type LogsResponse struct {
	Data       []byte `json:"data"`
	NextOffset int64  `json:"next_offset"`
}

func (c *Client) Exec(ctx context.Context, r ExecRequest) error {
	_, err := Exec.Call(ctx, c.nc, c.host, r)
	return err
}
func (c *Client) Copy(ctx context.Context, r CopyRequest) error {
	_, err := Copy.Call(ctx, c.nc, c.host, r)
	return err
}
func (c *Client) Logs(ctx context.Context, r LogsRequest) (LogsResponse, error) {
	return Logs.Call(ctx, c.nc, c.host, r)
}

// VMEvent is published on nexus.events.vmm.<id> when a VM ends without being asked to
// (crash, hang, an adoption that failed after a vmm restart).
type VMEvent struct {
	ID     string    `json:"id"`
	Failed string    `json:"failed"`
	Time   time.Time `json:"time"`
}

// VMEventSubject is where VMEvents for id are published.
func VMEventSubject(id string) string { return bus.EventsPrefix + ".vmm." + id }

// DiskEvent is published on nexus.events.host.<host>.disk when the free space of the host's
// $NEXUS_HOME crosses the low watermark, either way. Below it new sandboxes are refused; running
// ones are not stopped.
type DiskEvent struct {
	Host      string    `json:"host"`
	Low       bool      `json:"low"`
	Message   string    `json:"message"`
	FreeBytes uint64    `json:"free_bytes"`
	MinBytes  uint64    `json:"min_bytes"` // the watermark on this filesystem
	Time      time.Time `json:"time"`
}

// DiskEventSubject is where DiskEvents of host are published.
func DiskEventSubject(host string) string { return bus.EventsPrefix + ".host." + host + ".disk" }

// ImageInfo describes a root image: a built-in one (nexus-base, tagged with its build date and
// latest) or an OCI image pulled or imported (its digest, its config's defaults for exec).
type ImageInfo struct {
	Name        string            `json:"name"`
	Tags        []string          `json:"tags"`
	Digest      string            `json:"digest,omitempty"`
	IndexDigest string            `json:"index_digest,omitempty"`
	Key         string            `json:"key,omitempty"` // what sandboxes and snapshots record
	Source      string            `json:"source,omitempty"`
	Created     time.Time         `json:"created,omitzero"`
	Built       time.Time         `json:"built,omitzero"`
	SizeBytes   int64             `json:"size_bytes"`
	Path        string            `json:"path,omitempty"`
	Env         []string          `json:"env,omitempty"`
	WorkingDir  string            `json:"working_dir,omitempty"`
	User        string            `json:"user,omitempty"`
	Entrypoint  []string          `json:"entrypoint,omitempty"`
	Cmd         []string          `json:"cmd,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// ExposedPorts are the image's EXPOSE ports (PORT/tcp), for information: nexus forwards
	// whatever a guest listens on.
	ExposedPorts []string `json:"exposed_ports,omitempty"`
	UsedBy       []string `json:"used_by,omitempty"` // sandboxes and snapshots on its base (inspect)
	// Templates are the booted templates of the image (`nexus image warm`), one per shape.
	Templates []TemplateInfo `json:"templates,omitempty"`
}

// ImageRequest builds, pulls, imports, inspects or removes an image. Progress, when set, is a
// stream session id whose .out on the vmm's host receives ImageProgress messages.
type ImageRequest struct {
	Op    string `json:"op"`   // build, pull, import, save, commit, layer-save, inspect, rm or warm
	Name  string `json:"name"` // the image (build, inspect, rm), the reference (pull), the name to give (import)
	Force bool   `json:"force,omitempty"`
	// File is the tarball or OCI layout to import, or the tarball save writes, a path on the
	// vmm's host.
	File string `json:"file,omitempty"`
	// SID, for an import, is a stream session the archive comes over instead of File (import -,
	// whatever host the CLI is on): the vmm sends "ready" on it, then reads stdin to its close.
	SID string `json:"sid,omitempty"`
	// Pull options: registry credentials (else the user's docker config) and plain HTTP.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	Insecure bool   `json:"insecure,omitempty"`
	// Bounds on the unpacked image (0: the defaults, image.DefaultMaxBytes/DefaultMaxInodes).
	MaxBytes  int64  `json:"max_bytes,omitempty"`
	MaxInodes int64  `json:"max_inodes,omitempty"`
	Progress  string `json:"progress,omitempty"`

	// Commit makes Name (NAME[:TAG]) an image: the disk of the stopped Sandbox (its name at the
	// gateway, its id at the vmm), or, without one, the root of the image with key Base under a
	// new Config. BuildKey, when set, is the build's cache key (BuildDigest derives the image's
	// digest from it), so an unchanged build is found again. Base may name a build cache layer
	// (layer-<key>), whose root is flattened into the image. Layer-save keeps the disk of the
	// builder Sandbox as the layer of the step with cache key BuildKey.
	Sandbox  string       `json:"sandbox,omitempty"`
	Base     string       `json:"base,omitempty"`
	BuildKey string       `json:"build_key,omitempty"`
	Source   string       `json:"source,omitempty"` // what image ls says it came from
	Config   *ImageConfig `json:"config,omitempty"`
	// Warm (op warm) is the shape of the template to build; the gateway fills in its defaults.
	Warm *TemplateShape `json:"warm,omitempty"`
}

// TemplateShape is what a template is built for: a create of this shape restores it.
type TemplateShape struct {
	MemoryMiB int  `json:"memory_mib"`
	VCPUs     int  `json:"vcpus"`
	DiskMiB   int  `json:"disk_mib,omitempty"`
	Net       bool `json:"net"`
	Shares    int  `json:"shares,omitempty"`
}

// ImageConfig is what a committed image's exec defaults are.
type ImageConfig struct {
	Env          []string          `json:"env,omitempty"`
	WorkingDir   string            `json:"working_dir,omitempty"`
	User         string            `json:"user,omitempty"`
	Entrypoint   []string          `json:"entrypoint,omitempty"`
	Cmd          []string          `json:"cmd,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	ExposedPorts []string          `json:"exposed_ports,omitempty"`
}

// ImageConfig returns the exec defaults an image's record carries.
func (i ImageInfo) ImageConfig() *ImageConfig {
	return &ImageConfig{Env: i.Env, WorkingDir: i.WorkingDir, User: i.User, Entrypoint: i.Entrypoint, Cmd: i.Cmd,
		Labels: i.Labels, ExposedPorts: i.ExposedPorts}
}

// BuildDigest is the digest of the image a build with cache key key makes. It is a hash of a
// hash under a prefix of its own, so no build can claim a pulled image's digest.
func BuildDigest(key string) string {
	sum := sha256.Sum256([]byte("nexus image build\x00" + key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ImageKey is the key (file stem) of the image with a digest.
func ImageKey(digest string) string { return strings.Replace(digest, ":", "-", 1) }

// ImageProgress is one progress report of a build.
type ImageProgress struct {
	Step     string  `json:"step"`
	Fraction float64 `json:"fraction"`
	// Layer progress of a pull or import: the layer's digest, bytes done of its size.
	Layer string `json:"layer,omitempty"`
	Done  int64  `json:"done,omitempty"`
	Total int64  `json:"total,omitempty"`
}

func (c *Client) Images(ctx context.Context) ([]ImageInfo, error) {
	return Images.Call(ctx, c.nc, c.host, Empty{})
}
func (c *Client) Image(ctx context.Context, r ImageRequest) (ImageInfo, error) {
	return Image.Call(ctx, c.nc, c.host, r)
}
