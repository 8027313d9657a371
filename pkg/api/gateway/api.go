package gateway

import (
	"time"

	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/config"
)

// CreateRequest asks for a new sandbox; zero values take the defaults.
type CreateRequest struct {
	Name      string            `json:"name"`
	Image     string            `json:"image,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	MemoryMiB int               `json:"memory_mib,omitempty"`
	VCPUs     int               `json:"vcpus,omitempty"`
	CPUs      float64           `json:"cpus,omitempty"`     // host CPU quota in CPUs (fractional); 0: vcpus
	DiskMiB   int               `json:"disk_mib,omitempty"` // root disk size; 0: the image's
	// DiskBps and DiskIOPS bound the sandbox's disk reads and writes (each direction, its disks
	// together) in bytes and operations per second (--disk-bps, --disk-iops); 0: the defaults.
	DiskBps    int64  `json:"disk_bps,omitempty"`
	DiskIOPS   int    `json:"disk_iops,omitempty"`
	Agent      string `json:"agent,omitempty"`
	EgressMode string `json:"egress_mode,omitempty"` // curated|allow-all[=DURATION]|none
	// EgressAsk makes hosts off the list pending requests a person may approve (--egress-ask).
	EgressAsk     bool     `json:"egress_ask,omitempty"`
	AllowHosts    []string `json:"allow_hosts,omitempty"`
	AllowPrivate  []string `json:"allow_private,omitempty"` // CIDRs of private addresses allowed names may lead to
	Repos         []string `json:"repos,omitempty"`
	Secrets       []string `json:"secrets,omitempty"`     // NAME@host[,host][:header=NAME]
	Mounts        []string `json:"mounts,omitempty"`      // host:guest[:ro]
	MountNamed    []string `json:"mount_named,omitempty"` // name:guest[,kind=disk]
	NoPortForward bool     `json:"no_port_forward,omitempty"`
	Ephemeral     bool     `json:"ephemeral,omitempty"`
	// Cold boots the new sandbox even when a booted template of its shape exists (--cold);
	// by default a create restores the template (issue 24).
	Cold bool `json:"cold,omitempty"`
	// NoStart leaves the new sandbox created (a record, no VM) for a later start; the MCP
	// sandbox_create does this unless asked to start.
	NoStart bool `json:"no_start,omitempty"`
	// TTL, when set, is how long the sandbox may live: it is removed at CreatedAt+TTL, whatever
	// its state (ParseTTL: a Go duration or whole days, e.g. 90m, 2h30m, 7d).
	TTL string `json:"ttl,omitempty"`
	// IdleTimeout, when set, pauses the sandbox after this long without exec, attach, copy or
	// network activity while its CPU stays under IdleCPUPercent; the next exec resumes it.
	IdleTimeout string `json:"idle_timeout,omitempty"`
	// Limits are egress budgets (--max-conns, --conn-rate, --dns-rate, --egress-bandwidth); zero
	// fields take the project config's, then the defaults.
	Limits netapi.Limits `json:"limits,omitzero"`
	// Config is the project's .nexus/config.yaml (or --config), parsed and validated by the CLI;
	// the gateway validates it again.
	Config *config.Config `json:"config,omitempty"`
	// Progress, when set, is a stream session id whose .out on the sandbox's host receives boot
	// steps (vmm.Step JSON) as they finish (stream.Follow follows it).
	Progress string `json:"progress,omitempty"`
	// UserSecrets is set by `nexus create` only: its Secrets were typed by the user, who alone
	// may bind a secret stored without hosts. Any other creator (the MCP server) leaves it unset
	// and binds only within the hosts stored with each secret.
	UserSecrets bool `json:"user_secrets,omitempty"`
	// NoStoredSecrets binds no stored secret by default: not --repo's GH_TOKEN, not the agent
	// profile's (codex's OPENAI_API_KEY). The HTTP API sets it for a caller below admin, whose
	// creates may not reach the host's secrets.
	NoStoredSecrets bool `json:"no_stored_secrets,omitempty"`
	// Host places the sandbox on that host (--host); HostLabels on a host whose heartbeat has
	// every one of these labels (--host-label zone=a). Neither: the host up with the most free
	// memory that fits, or the gateway's own when what it needs is there only (--mount).
	Host       string            `json:"host,omitempty"`
	HostLabels map[string]string `json:"host_labels,omitempty"`
}

// ListRequest selects sandboxes; stopped and failed ones only with All. A reply is one page,
// by name: at most Limit sandboxes (ListPage when 0 or more) named after After. The typed
// client's List pages through them all.
type ListRequest struct {
	Selector []string `json:"selector,omitempty"`
	All      bool     `json:"all,omitempty"`
	After    string   `json:"after,omitempty"`
	Limit    int      `json:"limit,omitempty"`
	// MaxBytes, when set, also ends a page before its JSON would pass MaxBytes (a page has at
	// least one sandbox, and never passes ListPageBytes): records carrying a project config are
	// large, and 2500 of them would not fit one bus message. A page may then hold fewer than
	// Limit with more to come: a caller that sets MaxBytes reads on until an empty page (a
	// gateway from before it ignores it, and its last page is short, then one empty).
	MaxBytes int `json:"max_bytes,omitempty"`
}

// ListPage is the most sandboxes one List reply holds, so that a reply stays far below the
// bus's largest message however many sandboxes there are.
const ListPage = 2500

// ListPageBytes is the most a List page of a caller that sets MaxBytes holds: half the bus's
// largest message (8 MiB).
const ListPageBytes = 4 << 20

// NamesRequest names sandboxes by name or by selector (not both).
type NamesRequest struct {
	Names    []string `json:"names,omitempty"`
	Selector []string `json:"selector,omitempty"`
	Force    bool     `json:"force,omitempty"`
}

// NameRequest names one sandbox.
type NameRequest struct {
	Name string `json:"name"`
}

// Result is the outcome for one sandbox of a verb applied to several.
type Result struct {
	Name  string `json:"name"`
	State State  `json:"state,omitempty"`
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`
}

// SandboxView is a sandbox with what the vmm measures of it (ps columns).
type SandboxView struct {
	Sandbox
	RSSBytes int64 `json:"rss_bytes,omitempty"`
	// AuditLimited is set when the sandbox keeps hitting its audit limit (docs/audit.md).
	AuditLimited *AuditLimit `json:"audit_limited,omitempty"`
	// Containment says how the sandbox's VM is contained (a running one): "contained", or
	// "less contained: …"/"not contained: …" with why.
	Containment string `json:"containment,omitempty"`
	// encoded is Sandbox as JSON when the gateway kept it encoded (UseEncoded).
	encoded []byte
}

// AuditLimit flags a sandbox whose decisions were over its audit rate lately: the services wrote
// `suppressed` summaries for it instead of its events, the last at Last, standing for Suppressed
// events (the last summary of each service).
type AuditLimit struct {
	Last       time.Time `json:"last"`
	Suppressed int64     `json:"suppressed"`
}

// CreateTimeout bounds a create: image preparation plus a TCG boot.
const CreateTimeout = 5 * time.Minute

// ExecRequest runs a command in a named sandbox; I/O flows on stream session SID, which the
// caller opened (stream.Client) before asking.
type ExecRequest struct {
	Name    string   `json:"name"`
	SID     string   `json:"sid"`
	Argv    []string `json:"argv"`
	Env     []string `json:"env,omitempty"`
	Dir     string   `json:"dir,omitempty"`
	User    string   `json:"user,omitempty"` // the guest user to run as (default: the image's, else root)
	TTY     bool     `json:"tty,omitempty"`
	Rows    uint16   `json:"rows,omitempty"`
	Cols    uint16   `json:"cols,omitempty"`
	Stdin   bool     `json:"stdin,omitempty"`
	Timeout string   `json:"timeout,omitempty"`
}

// Started is the reply to an Exec or a Copy: the host whose vmm serves the stream session
// (the sandbox's), so that the caller hears that host only (stream.Session.Bind). An older
// gateway names none; the caller then takes the first host to speak.
type Started struct {
	Host string `json:"host,omitempty"`
}

// CopyRequest moves one file between the caller and a sandbox over stream session SID.
type CopyRequest struct {
	Name    string `json:"name"`
	SID     string `json:"sid"`
	ToGuest bool   `json:"to_guest"`
	Path    string `json:"path"`
	Mode    uint32 `json:"mode,omitempty"`
	Size    int64  `json:"size,omitempty"`
}

// LogsRequest reads a sandbox's console (or agent) log from a cursor.
type LogsRequest struct {
	Name   string `json:"name"`
	Offset int64  `json:"offset"`
	Max    int    `json:"max,omitempty"`
	Agent  bool   `json:"agent,omitempty"`
}

// LogsResponse is a chunk of log and the cursor to continue from.
type LogsResponse struct {
	Data       []byte `json:"data"`
	NextOffset int64  `json:"next_offset"`
}

// Empty is the request or response of endpoints that carry nothing.
type Empty struct{}

// ImageTimeout bounds an image build (a Debian debootstrap is ~40 s on a warm cache).
const ImageTimeout = 20 * time.Minute

// EgressView is what `nexus egress show` prints: the recorded perimeter and the live network
// (allowlist, mode, expiry, DNS table, counters).
type EgressView struct {
	Sandbox string       `json:"sandbox"`
	Egress  Egress       `json:"egress"`
	Secrets []string     `json:"secrets,omitempty"`
	Network *netapi.Info `json:"network,omitempty"`
	// AuditLimited: the sandbox keeps hitting its audit limit.
	AuditLimited *AuditLimit `json:"audit_limited,omitempty"`
}
