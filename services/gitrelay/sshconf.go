package gitrelay

import (
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Target is where the relay's ssh goes for a host the guest names.
type Target struct {
	User string // overrides the guest's user when set
	Host string
	Port int // 0: the guest's port, or ssh's default
}

// ParseHosts parses a host alias map: comma-separated NAME=[USER@]HOST[:PORT] (IPv6 in
// brackets).
func ParseHosts(s string) (map[string]Target, error) {
	out := map[string]Target{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, target, ok := strings.Cut(item, "=")
		name = strings.ToLower(strings.TrimSpace(name))
		if !ok || !hostRE.MatchString(name) {
			return nil, errdefs.Invalid("gitrelay: host alias %q: use name=[user@]host[:port]", item)
		}
		var t Target
		if u, rest, ok := strings.Cut(target, "@"); ok {
			if !userRE.MatchString(u) {
				return nil, errdefs.Invalid("gitrelay: host alias %q: bad user", item)
			}
			t.User, target = u, rest
		}
		host, port := target, ""
		if h, p, err := net.SplitHostPort(target); err == nil {
			host, port = h, p
		}
		if host == "" || strings.HasPrefix(host, "-") || strings.ContainsAny(host, " \t@") {
			return nil, errdefs.Invalid("gitrelay: host alias %q: bad host", item)
		}
		t.Host = host
		if port != "" {
			n, err := strconv.Atoi(port)
			if err != nil || n < 1 || n > 65535 {
				return nil, errdefs.Invalid("gitrelay: host alias %q: bad port", item)
			}
			t.Port = n
		}
		out[name] = t
	}
	return out, nil
}

// SSHConfig is how the relay runs the host's ssh.
type SSHConfig struct {
	// Binary is the ssh program (default "ssh").
	Binary string
	// Options are put before the relay's own options (e.g. -F, -o UserKnownHostsFile=…, -i).
	Options []string
	// Hosts maps a host the guest names to where ssh really goes.
	Hosts map[string]Target
	// Env is ssh's environment (default: PATH, HOME, USER, LOGNAME and SSH_AUTH_SOCK of this
	// process). GIT_PROTOCOL is added per connection.
	Env []string
}

func (c *SSHConfig) defaults() {
	if c.Binary == "" {
		c.Binary = "ssh"
	}
	if c.Env == nil {
		for _, k := range []string{"PATH", "HOME", "USER", "LOGNAME", "SSH_AUTH_SOCK"} {
			if v, ok := os.LookupEnv(k); ok {
				c.Env = append(c.Env, k+"="+v)
			}
		}
	}
}

// Argv is the ssh command line for cmd (without the binary).
func (c *SSHConfig) Argv(cmd Command) []string {
	user, host, port := cmd.User, cmd.Host, cmd.Port
	if t, ok := c.Hosts[cmd.Host]; ok {
		host = t.Host
		if t.User != "" {
			user = t.User
		}
		if t.Port != 0 {
			port = t.Port
		}
	}
	argv := append([]string{}, c.Options...)
	// No tty, no forwarding of any kind (above all not the host's agent), no prompts.
	argv = append(argv, "-T", "-x", "-a", "-o", "ClearAllForwardings=yes", "-o", "PermitLocalCommand=no", "-o", "BatchMode=yes")
	if cmd.IPv != "" {
		argv = append(argv, cmd.IPv)
	}
	if port != 0 {
		argv = append(argv, "-p", strconv.Itoa(port))
	}
	if cmd.SendProtocol {
		argv = append(argv, "-o", "SendEnv=GIT_PROTOCOL")
	}
	dest := host
	if user != "" {
		dest = user + "@" + host
	}
	return append(argv, "--", dest, cmd.RemoteCommand())
}
