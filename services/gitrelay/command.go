package gitrelay

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
)

// The two git services the relay runs.
const (
	UploadPack  = "git-upload-pack"
	ReceivePack = "git-receive-pack"
)

// MaxArgs and MaxArg bound the argv a guest may send.
const (
	MaxArgs = 16
	MaxArg  = 1024
)

// Command is a parsed, checked ssh invocation of git: what git asked `ssh` to run.
type Command struct {
	User    string // login user ("git"), "" when none was given
	Host    string // lower case
	Port    int    // 0 when none was given
	IPv     string // "-4", "-6" or ""
	Service string // UploadPack or ReceivePack
	Path    string // the repository path as git quoted it, unquoted ("owner/repo.git")
	Repo    string // owner/repo, lower case (httppolicy.ParseRepo)
	// SendProtocol: git asked for GIT_PROTOCOL to be sent (-o SendEnv=GIT_PROTOCOL).
	SendProtocol bool
}

// RemoteCommand is the command line the relay asks the remote to run, rebuilt from the checked
// parts (never the guest's bytes).
func (c Command) RemoteCommand() string { return c.Service + " '" + c.Path + "'" }

var (
	userRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$`)
	hostRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
	// pathRE: [/]owner/repo[.git][/] with GitHub's name characters only: nothing a shell, ssh
	// or git would interpret (no quote, space, ~, $, backslash, option dash at the start).
	pathRE = regexp.MustCompile(`^/?([A-Za-z0-9_.-]{1,100})/([A-Za-z0-9_.-]{1,100})/?$`)
)

// refuse is a refusal of a command that is not one git fetch or push of one repository.
func refuse(format string, a ...any) error {
	return errdefs.New(errdefs.ErrRefused, "nexus: refused: "+fmt.Sprintf(format, a...)+
		"; the git relay runs only git-upload-pack '<owner/repo>' and git-receive-pack '<owner/repo>'")
}

// ParseCommand checks the argv git gave ssh (without the program name) and returns the
// invocation. It accepts exactly what git's ssh transport sends: options among
// `-o SendEnv=GIT_PROTOCOL`, `-p PORT`, `-4`, `-6`, then `[user@]host`, then one argument
// `git-upload-pack '<path>'` or `git-receive-pack '<path>'` naming owner/repo. Anything else —
// another option (`-oProxyCommand=…`, `-s`), another program (a shell, sftp), extra arguments, a
// path with quoting or shell characters — is refused.
func ParseCommand(args []string) (Command, error) {
	var c Command
	if len(args) > MaxArgs {
		return c, refuse("too many ssh arguments")
	}
	for _, a := range args {
		if len(a) > MaxArg {
			return c, refuse("ssh argument longer than %d bytes", MaxArg)
		}
		if strings.ContainsAny(a, "\x00\r\n") {
			return c, refuse("control characters in an ssh argument")
		}
	}
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		a := args[i]
		switch {
		case a == "--":
			i++
			goto dest
		case a == "-4" || a == "-6":
			c.IPv = a
		case a == "-o" || a == "-p":
			if i+1 >= len(args) {
				return c, refuse("ssh option %s without a value", a)
			}
			i++
			if err := c.option(a, args[i]); err != nil {
				return c, err
			}
		case strings.HasPrefix(a, "-o") || strings.HasPrefix(a, "-p"):
			if err := c.option(a[:2], a[2:]); err != nil {
				return c, err
			}
		default:
			return c, refuse("ssh option %s is not allowed", clip(a))
		}
	}
dest:
	if i >= len(args) {
		return c, refuse("no host")
	}
	dest := args[i]
	i++
	if u, h, ok := strings.Cut(dest, "@"); ok {
		if !userRE.MatchString(u) {
			return c, refuse("bad user name %s", clip(u))
		}
		c.User, dest = u, h
	}
	c.Host = strings.ToLower(dest)
	if len(c.Host) > 253 || !hostRE.MatchString(c.Host) {
		return c, refuse("bad host name %s", clip(dest))
	}
	switch len(args) - i {
	case 0:
		return c, refuse("an interactive shell is not allowed")
	case 1:
	default:
		return c, refuse("extra arguments after the command")
	}
	svc, quoted, ok := strings.Cut(args[i], " ")
	if !ok || (svc != UploadPack && svc != ReceivePack) {
		name, _, _ := strings.Cut(args[i], " ")
		return c, refuse("command %s is not allowed", clip(name))
	}
	c.Service = svc
	if len(quoted) < 2 || quoted[0] != '\'' || quoted[len(quoted)-1] != '\'' {
		return c, refuse("the repository path must be one single-quoted argument")
	}
	c.Path = quoted[1 : len(quoted)-1]
	m := pathRE.FindStringSubmatch(c.Path)
	if m == nil || strings.Contains(c.Path, "..") {
		return c, refuse("repository path %s is not owner/repo", clip(c.Path))
	}
	name := strings.TrimSuffix(m[2], ".git")
	repo, ok := httppolicy.ParseRepo(m[1] + "/" + name)
	if !ok || name == "" {
		return c, refuse("repository path %s is not owner/repo", clip(c.Path))
	}
	c.Repo = repo
	return c, nil
}

// option applies one -o or -p value.
func (c *Command) option(flag, v string) error {
	if flag == "-p" {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != v {
			return refuse("bad port %s", clip(v))
		}
		c.Port = p
		return nil
	}
	// git sends exactly this one option (protocol v2 over ssh); ssh accepts "k=v" and "k v".
	k, val, ok := strings.Cut(v, "=")
	if !ok {
		k, val, ok = strings.Cut(v, " ")
	}
	if ok && strings.EqualFold(strings.TrimSpace(k), "SendEnv") && strings.TrimSpace(val) == "GIT_PROTOCOL" {
		c.SendProtocol = true
		return nil
	}
	name := k
	if name == "" {
		name = v
	}
	return refuse("ssh option -o %s is not allowed", clip(name))
}

// gitProtocolRE is what GIT_PROTOCOL may carry to the remote.
var gitProtocolRE = regexp.MustCompile(`^version=[0-2](:[A-Za-z0-9_=.-]{1,64}){0,4}$`)

// clip makes untrusted text safe for one line of an error: printable ASCII, at most 64 bytes.
func clip(s string) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < 64; i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f {
			c = '?'
		}
		b.WriteByte(c)
	}
	if len(s) > 64 {
		b.WriteString("…")
	}
	return b.String()
}
