// Package gateway is the contract of the gateway's bus API: the sandbox record, its states,
// the request and response types, and a typed client used by the CLI and the MCP server alike.
package gateway

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// State is a sandbox's lifecycle state (DESIGN §3).
type State string

const (
	StateCreated  State = "created"
	StateStarting State = "starting"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateRemoving State = "removing"
	StateFailed   State = "failed"
)

// transitions lists, for each state, the states it may move to. Any state may move to removing
// and to failed.
var transitions = map[State][]State{
	StateCreated:  {StateStarting},
	StateStarting: {StateRunning, StateStopping},
	StateRunning:  {StatePaused, StateStopping},
	StatePaused:   {StateRunning, StateStopping},
	StateStopping: {StateStopped},
	StateStopped:  {StateStarting},
	StateFailed:   {StateStarting, StateStopping, StateStopped},
	StateRemoving: {},
}

// CanTransition reports whether from → to is a legal move.
func CanTransition(from, to State) bool {
	if to == StateRemoving || to == StateFailed {
		return from != StateRemoving || to == StateFailed
	}
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Egress modes.
// DefaultImage is the root image of a sandbox created without --image.
const DefaultImage = "nexus-base"

const (
	EgressCurated  = "curated"
	EgressAllowAll = "allow-all"
	EgressNone     = "none"
)

// Egress is a sandbox's perimeter configuration.
type Egress struct {
	Mode          string    `json:"mode"`
	AllowAllUntil time.Time `json:"allow_all_until,omitzero"`
	Allow         []string  `json:"allow,omitempty"` // host[:port], as given
	Repos         []string  `json:"repos,omitempty"` // owner/repo bound with --repo
	// Limits are the egress budgets asked for (flags over egress.limits); zero fields are the
	// netstack's defaults.
	Limits netapi.Limits `json:"limits,omitzero"`
	// AllowPrivate are the CIDRs of non-public addresses the sandbox may reach (--allow-private
	// and the config's egress.allow_private); every other one is refused (private_address).
	AllowPrivate []string `json:"allow_private,omitempty"`
	// Grants are live allow rules added to Allow (`nexus egress allow`), Denies live denies that
	// beat every rule (`nexus egress deny`); expired ones are dropped by the gateway.
	Grants []Grant `json:"grants,omitempty"`
	Denies []Grant `json:"denies,omitempty"`
	// Ask holds a query for a host off the list as a pending request (--egress-ask,
	// egress.ask); Requests are the pending ones, at most MaxPendingRequests.
	Ask      bool            `json:"ask,omitempty"`
	Requests []EgressRequest `json:"requests,omitempty"`
}

// MaxPendingRequests bounds an ask-mode sandbox's pending requests; past it, new hosts are
// counted in the oldest request's place.
const MaxPendingRequests = 32

// SecretBinding binds a named secret to the hosts it may be swapped for.
type SecretBinding struct {
	Name  string   `json:"name"`
	Hosts []string `json:"hosts"`
	Kind  string   `json:"kind,omitempty"` // github, anthropic, openai or generic
	Env   string   `json:"env,omitempty"`  // an extra guest variable carrying the placeholder
	// Header is the request header the placeholder is swapped in (x-api-key); "" is
	// Authorization.
	Header string `json:"header,omitempty"`
}

// Mount is a host directory shared into the guest.
type Mount struct {
	Host     string `json:"host"`
	Guest    string `json:"guest"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Volume is a named per-sandbox disk for write-heavy paths.
type Volume struct {
	Name  string `json:"name"`
	Guest string `json:"guest"`
	// SizeMiB is the size of its image when first made (size=); 0 in a record from before it:
	// DefaultVolumeMiB.
	SizeMiB int `json:"size_mib,omitempty"`
}

// MaxDiskMiB is the largest root disk (--disk) asked for; without --disk the disk is the
// image's own size, and the guest's file system is not grown.
const (
	MaxDiskMiB = 4 << 20
	// DefaultVolumeMiB is a named volume's size without size= (sparse too).
	DefaultVolumeMiB = 8 << 10
	// DefaultDiskBps and DefaultDiskIOPS bound a sandbox's disk I/O without --disk-bps and
	// --disk-iops: each direction, its disks together, per second.
	DefaultDiskBps  = 256 << 20
	DefaultDiskIOPS = 8192
	// MinDiskBps, MaxDiskBps, MinDiskIOPS and MaxDiskIOPS are the range --disk-bps and
	// --disk-iops take.
	MinDiskBps, MaxDiskBps   = 64 << 10, 64 << 30
	MinDiskIOPS, MaxDiskIOPS = 10, 1 << 20
)

// Sandbox is one record in the registry (KV nexus_sandboxes, key = Name).
type Sandbox struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"` // project/name
	Labels    map[string]string `json:"labels,omitempty"`
	Image     string            `json:"image"`
	MemoryMiB int               `json:"memory_mib"`
	VCPUs     int               `json:"vcpus"`
	CPUs      float64           `json:"cpus,omitempty"` // host CPU quota; 0: VCPUs
	// DiskMiB is the root disk's size (--disk); 0 in a record from before it: the image's size.
	DiskMiB int `json:"disk_mib,omitempty"`
	// DiskBps and DiskIOPS bound its disk I/O, each direction, per second (--disk-bps,
	// --disk-iops); 0, as in a record from before them: DefaultDiskBps, DefaultDiskIOPS.
	DiskBps       int64           `json:"disk_bps,omitempty"`
	DiskIOPS      int             `json:"disk_iops,omitempty"`
	Agent         string          `json:"agent"`
	Egress        Egress          `json:"egress"`
	Secrets       []SecretBinding `json:"secrets,omitempty"`
	Mounts        []Mount         `json:"mounts,omitempty"`
	Volumes       []Volume        `json:"volumes,omitempty"`
	NoPortForward bool            `json:"no_port_forward,omitempty"`
	Ephemeral     bool            `json:"ephemeral,omitempty"` // removed when its lease lapses
	State         State           `json:"state"`
	Reason        string          `json:"reason,omitempty"` // why it failed
	Host          string          `json:"host"`             // the machine it is placed on
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	StartedAt     time.Time       `json:"started_at,omitzero"`
	// ExpiresAt, when set (--ttl), is when the sandbox is removed.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// IdleTimeout, when set (--idle-timeout, a ParseLifetime value), is how long the sandbox
	// may go without activity before it is paused (gateway/idle.go).
	IdleTimeout string `json:"idle_timeout,omitempty"`
	// Revision is the KV revision this copy was read at; updates are checked against it.
	Revision uint64 `json:"revision,omitempty"`
	// Config is the .nexus/config.yaml the sandbox was created with: its egress.policy gates
	// requests (pkg/httppolicy), its allow and secrets joined the allowlist and the bindings.
	Config *config.Config `json:"config,omitempty"`
	// Fork, on a fork whose VM has not run yet, names the snapshot it is restored from: a fork
	// cut off by a crash is restored again by `nexus start`, never cold-booted from its image.
	Fork string `json:"fork,omitempty"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ParseName validates a sandbox name and returns its canonical project/name form: a name
// without a project is in project "default".
func ParseName(s string) (string, error) {
	project, name, ok := strings.Cut(s, "/")
	if !ok {
		project, name = "default", s
	}
	if !nameRE.MatchString(project) || !nameRE.MatchString(name) {
		return "", errdefs.Invalid("invalid sandbox name %q: use [project/]name, each part 1-63 of a-z 0-9 - _ starting with a letter or digit", s)
	}
	return project + "/" + name, nil
}

// FullName joins an optional project and a name ("p" + "n" → "p/n") and parses the result. A
// name that already names a project is taken as is when no project is given.
func FullName(project, name string) (string, error) {
	if name == "" {
		return "", errdefs.Invalid("name is required")
	}
	if project != "" {
		if strings.Contains(name, "/") {
			return "", errdefs.Invalid("name %q already names a project; do not also pass project %q", name, project)
		}
		name = project + "/" + name
	}
	return ParseName(name)
}

// Owned says whether sb, as a Get answered it (sb, err), is the sandbox its caller made: it
// carries label key=value. A sandbox that is gone is not, and is no error; one of the same name
// made by someone else is not either.
func Owned(sb *Sandbox, err error, key, value string) (bool, error) {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return sb.Labels[key] == value, nil
}

// Selector is a parsed label selector: k=v, k!=v and k (present), comma-separated, all must hold.
// In a value, a backslash escapes the next character, so that `a=x\,y` matches the value "x,y"
// and any value a label may hold can be selected.
type Selector []term

type term struct {
	key, value string
	op         string // "=", "!=", "exists"
}

// Label limits (as in Kubernetes, with longer, freer values): a key is 1-63 letters, digits,
// '.', '_', '/' or '-' starting with a letter or digit; a value is up to MaxLabelValue bytes of
// printable UTF-8 (no control or format characters: nothing that breaks a line of `ps`), not
// beginning or ending with a space; a sandbox has at most MaxLabels labels.
const (
	MaxLabelValue = 253
	MaxLabels     = 64
)

var labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)

const labelRules = "a key is 1-63 letters, digits, '.', '_', '/' or '-' starting with a letter or digit; " +
	"a value is up to 253 printable characters, not beginning or ending with a space"

func isKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '/' || c == '-'
}

// ParseSelector parses selector expressions; several may be given (repeated -l flags).
func ParseSelector(exprs ...string) (Selector, error) {
	var sel Selector
	for _, expr := range exprs {
		parts, err := splitEscaped(expr)
		if err != nil {
			return nil, errdefs.Invalid("invalid label selector %q: %v", expr, err)
		}
		for _, part := range parts {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			i := 0
			for i < len(part) && isKeyByte(part[i]) {
				i++
			}
			t := term{key: part[:i], op: "exists"}
			rest := strings.TrimLeft(part[i:], " ")
			switch {
			case strings.HasPrefix(rest, "!="):
				t.op, rest = "!=", rest[2:]
			case strings.HasPrefix(rest, "="):
				t.op, rest = "=", rest[1:]
			case rest != "":
				return nil, errdefs.Invalid("invalid label selector %q: use k=v, k!=v or k (%s)", unescape(part), labelRules)
			}
			t.value = unescape(strings.TrimLeft(rest, " "))
			if !labelKeyRE.MatchString(t.key) {
				return nil, errdefs.Invalid("invalid label selector %q: a key is letters, digits, '.', '_', '/' or '-'", unescape(part))
			}
			sel = append(sel, t)
		}
	}
	return sel, nil
}

// splitEscaped splits s at the commas no backslash escapes, keeping the escapes.
func splitEscaped(s string) ([]string, error) {
	var parts []string
	start := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i+1 == len(s) {
				return nil, errors.New("it ends with a lone backslash (write \\\\ for one)")
			}
			i++
		case ',':
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:]), nil
}

// unescape drops the backslash before each escaped character.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// escapeValue is unescape's inverse: the value as a selector writes it.
func escapeValue(v string) string {
	if !strings.ContainsAny(v, `,\`) {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == ',' || v[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// Matches reports whether labels satisfy every term. An empty selector matches everything.
func (s Selector) Matches(labels map[string]string) bool {
	for _, t := range s {
		v, ok := labels[t.key]
		switch t.op {
		case "=":
			if !ok || v != t.value {
				return false
			}
		case "!=":
			if ok && v == t.value {
				return false
			}
		case "exists":
			if !ok {
				return false
			}
		}
	}
	return true
}

// ValidateLabel checks one label against the rules above; the error is one line an operator
// can act on, quoting (and so escaping) what was refused.
func ValidateLabel(key, value string) error {
	if !labelKeyRE.MatchString(key) {
		return errdefs.Invalid("invalid label key %.80q: %s", key, labelRules)
	}
	bad := ""
	switch {
	case len(value) > MaxLabelValue:
		bad = fmt.Sprintf("is %d bytes long", len(value))
	case !utf8.ValidString(value):
		bad = "is not valid UTF-8"
	case strings.HasPrefix(value, " ") || strings.HasSuffix(value, " "):
		bad = "begins or ends with a space"
	default:
		for _, r := range value {
			if !unicode.IsPrint(r) {
				bad = fmt.Sprintf("holds the unprintable character %U", r)
				break
			}
		}
	}
	if bad != "" {
		return errdefs.Invalid("invalid label %s: its value %.80q %s: %s", key, value, bad, labelRules)
	}
	return nil
}

// ValidateLabels checks every label of a create or fork request.
func ValidateLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return errdefs.Invalid("%d labels, more than %d", len(labels), MaxLabels)
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := ValidateLabel(k, labels[k]); err != nil {
			return err
		}
	}
	return nil
}

// ParseLabels parses k=v pairs given to --label.
func ParseLabels(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, errdefs.Invalid("invalid label %.80q: use key=value", p)
		}
		if err := ValidateLabel(k, v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	if len(out) > MaxLabels {
		return nil, errdefs.Invalid("%d labels, more than %d", len(out), MaxLabels)
	}
	return out, nil
}

// FormatLabels renders labels as sorted k=v,k=v, each value escaped as a selector writes it (so
// what `ps` shows can be given to `-l`).
func FormatLabels(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + escapeValue(labels[k])
	}
	return strings.Join(parts, ",")
}

// MaxTTL bounds --ttl.
const MaxTTL = 366 * 24 * time.Hour

// ParseTTL reads a --ttl: a Go duration (90s, 45m, 2h30m) or whole days (7d), from 1s to
// MaxTTL.
func ParseTTL(s string) (time.Duration, error) { return ParseLifetime("ttl", s) }

// ParseLifetime reads the value of a duration flag such as --ttl or --idle-timeout: a Go
// duration or whole days, from 1s to MaxTTL.
func ParseLifetime(flag, s string) (time.Duration, error) {
	var d time.Duration
	var err error
	if days, ok := strings.CutSuffix(s, "d"); ok && days != "" && strings.Trim(days, "0123456789") == "" && len(days) <= 3 {
		n := 0
		fmt.Sscan(days, &n)
		d = time.Duration(n) * 24 * time.Hour
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || d < time.Second || d > MaxTTL {
		return 0, errdefs.Invalid("invalid --%s %q: give a duration from 1s to 366d, such as 30m, 2h or 7d", flag, s)
	}
	return d, nil
}
