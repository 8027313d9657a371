// Package settings is the one table of nexus settings: every flag of `nexus up` and
// `nexus serve`, with the environment variable that is its default (so scripts, the Procfile and
// the tests keep working by setting the environment), and the few global flags every command,
// the CLI too, needs to find the stack.
//
// It is the only place that reads the process environment for settings: the composition root
// (`nexus up`, `nexus serve`) and the CLI's globals load it once and pass the values down in
// each service's Config. A value comes from the flag when it is given, else from the
// environment variable when it is set and not empty, else from the table's default.
package settings

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// Scope says which commands a setting belongs to.
type Scope int

const (
	// Global settings are flags of every command: the CLI needs them to find the stack.
	Global Scope = iota
	// Stack settings are flags of `nexus up` and `nexus serve` only.
	Stack
)

// Setting is one row of the table.
type Setting struct {
	Flag    string // the flag, without its dashes
	Env     string // the environment variable that is the flag's default
	Default string // used when neither is given
	Unset   string // for --help: what applies when Default is empty and nothing is given
	Arg     string // what the value looks like, in --help
	Help    string
	Scope   Scope
	Multi   bool                        // the flag may be repeated; values are joined with commas
	set     func(*Values, string) error // parses the raw value into Values
}

// Values is what the table resolves to.
type Values struct {
	Home    home.Dir
	BusPort int    // 0 only when the row was not loaded
	BusURL  string // empty: the URL the running bus wrote under Home
	// StreamPeerGone is how long an exec or copy stream waits for a silent other side.
	StreamPeerGone time.Duration

	Host            string
	Cache           string // empty: Home's cache directory
	Accel           string
	MountFS         string // auto or 9p: how --mount worktrees are shared
	MITMAddr        string
	UpstreamDNS     string
	ClaudeTokenURL  string
	GitrelaySSH     string
	GitrelaySSHOpts []string
	GitrelayHosts   string  // checked by the root with the relay's own parser
	MetricsAddr     string  // empty: no metrics endpoint
	MemoryShare     float64 // 0: the vmm's default
	VCPUOvercommit  bool
	// NoTemplates makes every create boot cold and builds no template (--templates=false).
	NoTemplates bool
	// MCPEgress lets the MCP tools egress_allow and egress_revoke change a sandbox's egress.
	MCPEgress   bool
	Resolve     map[string]string
	ExtraCA     string
	ExtraRoots  []*x509.Certificate
	MinFreeDisk home.Watermark

	// APIAddr is where the HTTP API listens (gateway/httpapi); empty: `nexus up` serves none and
	// `nexus serve api` its default. APITLSCert and APITLSKey are the certificate it serves.
	APIAddr    string
	APITLSCert string
	APITLSKey  string

	// HostLabels are this host's placement labels (--host-label zone=a).
	HostLabels map[string]string
}

// DefaultAPIAddr is where `nexus serve api` listens without --api.
const DefaultAPIAddr = "127.0.0.1:7477"

// Table is every setting, in the order --help lists them.
var Table = []Setting{
	{Flag: "home", Env: "NEXUS_HOME", Default: "~/.local/share/nexus", Arg: "dir", Scope: Global,
		Help: "where nexus keeps its state: bus, sandboxes, images, secrets",
		set: func(v *Values, s string) error {
			h, err := homeDir(s)
			v.Home = h
			return err
		}},
	{Flag: "bus-port", Env: "NEXUS_BUS_PORT", Default: strconv.Itoa(bus.DefaultPort), Arg: "port", Scope: Global,
		Help: "bus port on 127.0.0.1: where the bus listens, and where clients look while it is down",
		set: func(v *Values, s string) error {
			p, err := strconv.Atoi(s)
			if err != nil || p < 1 || p > 65535 {
				return fmt.Errorf("%q is not a port number (1-65535)", s)
			}
			v.BusPort = p
			return nil
		}},
	{Flag: "bus-url", Env: "NEXUS_BUS_URL", Arg: "url", Scope: Global,
		Help:  "bus URL to dial",
		Unset: "the URL the running bus wrote under the home",
		set: text(func(v *Values) *string { return &v.BusURL }, func(s string) bool {
			u, err := url.Parse(s)
			return err == nil && u.Scheme != "" && u.Host != ""
		}, "a URL such as nats://127.0.0.1:4244")},
	{Flag: "stream-peer-gone", Env: "NEXUS_STREAM_PEER_GONE", Default: "10s", Arg: "duration", Scope: Global,
		Help: "test aid: how long an exec or cp stream waits for a silent other side before ending (and killing the sandbox's command); a slow reader does not count as silent",
		set: func(v *Values, s string) error {
			d, err := time.ParseDuration(s)
			if err != nil || d < 100*time.Millisecond || d > time.Hour {
				return fmt.Errorf("%q is not a duration between 100ms and 1h", s)
			}
			v.StreamPeerGone = d
			return nil
		}},

	{Flag: "host", Env: "NEXUS_HOST", Default: bus.LocalHost, Arg: "name", Scope: Stack,
		Help: "this machine's name on the bus: the host its services serve and new sandboxes are placed on",
		set: text(func(v *Values) *string { return &v.Host }, func(s string) bool {
			return !strings.ContainsAny(s, ". *>\t")
		}, "a host name (no dots, spaces or wildcards)")},
	{Flag: "host-label", Env: "NEXUS_HOST_LABELS", Arg: "key=value", Scope: Stack, Multi: true,
		Help: "this host's placement labels, in its heartbeat (`nexus create --host-label zone=a` picks among the hosts that have them); repeatable or comma-separated",
		set: func(v *Values, s string) error {
			m := map[string]string{}
			for _, pair := range strings.Split(s, ",") {
				k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if !ok || k == "" || strings.ContainsAny(k+val, " \t\"") {
					return fmt.Errorf("%q is not key=value", pair)
				}
				m[k] = val
			}
			v.HostLabels = m
			return nil
		}},
	{Flag: "cache", Env: "NEXUS_CACHE", Arg: "dir", Scope: Stack,
		Help:  "download and image cache, shareable between homes",
		Unset: "<home>/cache",
		set: func(v *Values, s string) error {
			abs, err := filepath.Abs(s)
			v.Cache = abs
			return err
		}},
	{Flag: "accel", Env: "NEXUS_ACCEL", Default: "auto", Arg: "auto|kvm|tcg", Scope: Stack,
		Help: "QEMU accelerator: auto probes KVM once with a real boot and falls back to tcg",
		set: text(func(v *Values) *string { return &v.Accel }, func(s string) bool {
			return s == "auto" || s == "kvm" || s == "tcg"
		}, "one of auto, kvm, tcg")},
	{Flag: "mount-fs", Env: "NEXUS_MOUNT_FS", Default: "auto", Arg: "auto|9p", Scope: Stack,
		Help: "how --mount worktrees are shared: auto serves them over virtiofs where QEMU's virtiofsd is installed, else 9p",
		set: text(func(v *Values) *string { return &v.MountFS }, func(s string) bool {
			return s == "auto" || s == "9p"
		}, "one of auto, 9p")},
	{Flag: "metrics-addr", Env: "NEXUS_METRICS_ADDR", Arg: "[host]:port", Scope: Stack,
		Help:  "serve Prometheus metrics at http://ADDR/metrics (a bare :port is 127.0.0.1; anything wider is up to you)",
		Unset: "off",
		set:   listenAddr(func(v *Values) *string { return &v.MetricsAddr })},
	{Flag: "api", Env: "NEXUS_API", Arg: "[host]:port", Scope: Stack,
		Help:  "serve the HTTP API (and MCP at /mcp) at ADDR; beyond loopback only with --api-tls-cert and --api-tls-key (a bare :port is 127.0.0.1)",
		Unset: "off for `nexus up`, " + DefaultAPIAddr + " for `nexus serve api`",
		set:   listenAddr(func(v *Values) *string { return &v.APIAddr })},
	{Flag: "api-tls-cert", Env: "NEXUS_API_TLS_CERT", Arg: "file", Scope: Stack,
		Help: "PEM certificate (chain) the HTTP API serves; with --api-tls-key",
		set:  text(func(v *Values) *string { return &v.APITLSCert }, nil, "")},
	{Flag: "api-tls-key", Env: "NEXUS_API_TLS_KEY", Arg: "file", Scope: Stack,
		Help: "PEM private key of --api-tls-cert",
		set:  text(func(v *Values) *string { return &v.APITLSKey }, nil, "")},
	{Flag: "memory-share", Env: "NEXUS_MEMORY_SHARE", Default: "90%", Arg: "share", Scope: Stack,
		Help: "part of host memory the sandboxes of this host may take together, QEMU overhead included (a fraction or a percentage); a create past it is refused",
		set: func(v *Values, s string) error {
			f, err := parseShare(s)
			v.MemoryShare = f
			return err
		}},
	{Flag: "mcp-egress", Env: "NEXUS_MCP_EGRESS", Default: "false", Arg: "bool", Scope: Stack,
		Help: "let MCP clients change a running sandbox's egress (egress_allow, egress_revoke; never private addresses or a secret's hosts): an orchestrator can be prompt-injected",
		set: func(v *Values, s string) error {
			b, err := strconv.ParseBool(s)
			if err != nil {
				return fmt.Errorf("%q is not true or false", s)
			}
			v.MCPEgress = b
			return nil
		}},
	{Flag: "vcpu-overcommit", Env: "NEXUS_VCPU_OVERCOMMIT", Default: "false", Arg: "bool", Scope: Stack,
		Help: "let one sandbox have more vCPUs than the host has cores",
		set: func(v *Values, s string) error {
			b, err := strconv.ParseBool(s)
			if err != nil {
				return fmt.Errorf("%q is not true or false", s)
			}
			v.VCPUOvercommit = b
			return nil
		}},
	{Flag: "templates", Env: "NEXUS_TEMPLATES", Default: "true", Arg: "bool", Scope: Stack,
		Help: "restore new sandboxes from booted templates (warm create; the first create of an image and size builds one); false: every create boots cold",
		set: func(v *Values, s string) error {
			b, err := strconv.ParseBool(s)
			if err != nil {
				return fmt.Errorf("%q is not true or false", s)
			}
			v.NoTemplates = !b
			return nil
		}},
	{Flag: "min-free-disk", Env: "NEXUS_MIN_FREE_DISK", Default: home.DefaultWatermark, Arg: "size|percent", Scope: Stack,
		Help: "low free-space watermark of the home's filesystem: below it new sandboxes are refused (\"host disk full\") and an event is published; running ones are left alone",
		set: func(v *Values, s string) error {
			w, err := home.ParseWatermark(s)
			v.MinFreeDisk = w
			return err
		}},
	{Flag: "mitm-addr", Env: "NEXUS_MITM_ADDR", Arg: "host:port", Scope: Stack,
		Help:  "where the mitm accepts CONNECTs",
		Unset: "the address it used last time, else a free loopback port",
		set: text(func(v *Values) *string { return &v.MITMAddr }, func(s string) bool {
			_, _, err := net.SplitHostPort(s)
			return err == nil
		}, "host:port")},
	{Flag: "upstream-dns", Env: "NEXUS_UPSTREAM_DNS", Arg: "ip:port", Scope: Stack,
		Help:  "resolver the netstack asks for allowed names",
		Unset: "the first nameserver of /etc/resolv.conf",
		set: text(func(v *Values) *string { return &v.UpstreamDNS }, func(s string) bool {
			_, err := netip.ParseAddrPort(s)
			return err == nil
		}, "ip:port")},
	{Flag: "claude-token-url", Env: "NEXUS_CLAUDE_TOKEN_URL", Arg: "url", Scope: Stack,
		Help:  "test aid: OAuth token endpoint the credential guardian refreshes ~/.claude against",
		Unset: "Anthropic's",
		set: text(func(v *Values) *string { return &v.ClaudeTokenURL }, func(s string) bool {
			u, err := url.Parse(s)
			return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
		}, "an http(s) URL")},
	{Flag: "gitrelay-ssh", Env: "NEXUS_GITRELAY_SSH", Default: "ssh", Arg: "path", Scope: Stack,
		Help: "the host ssh program the git relay runs",
		set:  text(func(v *Values) *string { return &v.GitrelaySSH }, nil, "")},
	{Flag: "gitrelay-ssh-opts", Env: "NEXUS_GITRELAY_SSH_OPTS", Arg: "options", Scope: Stack,
		Help: `extra ssh options for the git relay, space-separated ("-F /path -o UserKnownHostsFile=...")`,
		set:  func(v *Values, s string) error { v.GitrelaySSHOpts = strings.Fields(s); return nil }},
	{Flag: "gitrelay-hosts", Env: "NEXUS_GITRELAY_HOSTS", Arg: "aliases", Scope: Stack,
		Help: "git host aliases, comma-separated name=[user@]host[:port]: where the relay's ssh really goes for a host the guest names",
		set:  text(func(v *Values) *string { return &v.GitrelayHosts }, nil, "")},
	{Flag: "resolve", Env: "NEXUS_RESOLVE", Arg: "host=addr", Scope: Stack, Multi: true,
		Help: "test/offline aid: connect to addr for host, like curl --resolve (the netstack's DNS and the mitm's dialer); repeatable or comma-separated",
		set: func(v *Values, s string) error {
			m, err := parseResolve(s)
			v.Resolve = m
			return err
		}},
	{Flag: "extra-ca", Env: "NEXUS_EXTRA_CA", Arg: "file", Scope: Stack,
		Help: "test/offline aid: PEM file of extra roots the mitm trusts for upstream TLS",
		set: func(v *Values, s string) error {
			roots, err := readRoots(s)
			v.ExtraCA, v.ExtraRoots = s, roots
			return err
		}},
}

// AddFlags declares the settings of scope on fs. Their defaults are listed in the usage text,
// not as the flags' default values: a flag is only taken when it is given.
func AddFlags(fs *pflag.FlagSet, scope Scope) {
	for i := range Table {
		s := &Table[i]
		if s.Scope != scope {
			continue
		}
		fs.Var(&value{multi: s.Multi, arg: s.Arg}, s.Flag, s.usage())
	}
}

func (s *Setting) usage() string {
	u := s.Help + " ($" + s.Env
	switch {
	case s.Default != "":
		u += ", default " + s.Default
	case s.Unset != "":
		u += ", default " + s.Unset
	}
	return u + ")"
}

// Load resolves every setting declared on fs (by AddFlags, on this command or a parent):
// the flag when given, else the environment variable, else the default. A bad value is one
// ErrInvalid error naming the flag and the variable.
func Load(fs *pflag.FlagSet) (*Values, error) {
	v := &Values{}
	for i := range Table {
		s := &Table[i]
		f := fs.Lookup(s.Flag)
		if f == nil {
			continue
		}
		if _, ok := f.Value.(*value); !ok {
			continue // a command's own flag of the same name (`nexus secret set --host`)
		}
		raw := s.Default
		if f.Changed {
			raw = f.Value.String()
		} else if e, ok := os.LookupEnv(s.Env); ok && e != "" {
			raw = e
		}
		if raw == "" {
			continue
		}
		if err := s.set(v, raw); err != nil {
			return nil, Invalid(s.Flag, err)
		}
	}
	return v, nil
}

// Invalid is the error for a bad value of the setting with this flag: one line naming both the
// flag and its environment variable.
func Invalid(flag string, err error) error {
	for _, s := range Table {
		if s.Flag == flag {
			return errdefs.Invalid("--%s (or $%s): %v", s.Flag, s.Env, err)
		}
	}
	return errdefs.Invalid("--%s: %v", flag, err)
}

// text sets the string field of Values that field returns, when ok (if any) accepts the value;
// otherwise the error says the value is not want.
func text(field func(*Values) *string, ok func(string) bool, want string) func(*Values, string) error {
	return func(v *Values, s string) error {
		if ok != nil && !ok(s) {
			return fmt.Errorf("%q is not %s", s, want)
		}
		*field(v) = s
		return nil
	}
}

// listenAddr sets the [host]:port field returns; a bare :port is 127.0.0.1.
func listenAddr(field func(*Values) *string) func(*Values, string) error {
	return func(v *Values, s string) error {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			return fmt.Errorf("%q is not [host]:port", s)
		}
		if host == "" {
			host = "127.0.0.1"
		}
		*field(v) = net.JoinHostPort(host, port)
		return nil
	}
}

// value is a setting's flag: a string, or a list for a repeatable one.
type value struct {
	vals  []string
	multi bool
	arg   string
}

func (v *value) String() string { return strings.Join(v.vals, ",") }
func (v *value) Type() string   { return v.arg }

func (v *value) Set(s string) error {
	if v.multi {
		v.vals = append(v.vals, s)
	} else {
		v.vals = []string{s}
	}
	return nil
}

// homeDir is an absolute home directory; a leading ~/ is the user's home.
func homeDir(s string) (home.Dir, error) {
	if rest, ok := strings.CutPrefix(s, "~/"); ok {
		h, err := os.UserHomeDir()
		if err != nil || h == "" {
			return "", fmt.Errorf("neither it nor HOME is set")
		}
		s = filepath.Join(h, rest)
	}
	abs, err := filepath.Abs(s)
	if err != nil {
		return "", err
	}
	return home.Dir(abs), nil
}

// parseShare reads a fraction in (0, 1] or a percentage such as 80%.
func parseShare(s string) (float64, error) {
	num, pct := strings.CutSuffix(s, "%")
	f, err := strconv.ParseFloat(num, 64)
	if err == nil && pct {
		f /= 100
	}
	if err != nil || f <= 0 || f > 1 {
		return 0, fmt.Errorf("%q is not a share: give a fraction in (0, 1] or a percentage such as 80%%", s)
	}
	return f, nil
}

// parseResolve parses "api.github.com=127.0.0.1:4443,github.com=127.0.0.1:4444".
func parseResolve(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		host, addr, ok := strings.Cut(pair, "=")
		if !ok || host == "" || addr == "" {
			return nil, fmt.Errorf("%q is not host=addr", pair)
		}
		out[strings.ToLower(host)] = addr
	}
	return out, nil
}

// readRoots reads the certificates of a PEM file.
func readRoots(path string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no certificate in %s", path)
	}
	return out, nil
}
