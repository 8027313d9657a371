package gitrelay

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/httppolicy"
)

func TestParseCommand(t *testing.T) {
	ok := []struct {
		args []string
		want Command
	}{
		{[]string{"git@github.com", "git-upload-pack 'acme/app.git'"},
			Command{User: "git", Host: "github.com", Service: UploadPack, Path: "acme/app.git", Repo: "acme/app"}},
		{[]string{"-o", "SendEnv=GIT_PROTOCOL", "git@GitHub.com", "git-receive-pack 'Acme/App'"},
			Command{User: "git", Host: "github.com", Service: ReceivePack, Path: "Acme/App", Repo: "acme/app", SendProtocol: true}},
		{[]string{"-p", "2222", "-4", "github.com", "git-upload-pack '/acme/app.git/'"},
			Command{Host: "github.com", Port: 2222, IPv: "-4", Service: UploadPack, Path: "/acme/app.git/", Repo: "acme/app"}},
		{[]string{"-oSendEnv=GIT_PROTOCOL", "-p22", "git@github.com", "git-upload-pack 'a/b'"},
			Command{User: "git", Host: "github.com", Port: 22, Service: UploadPack, Path: "a/b", Repo: "a/b", SendProtocol: true}},
		{[]string{"--", "git@github.com", "git-upload-pack 'a/b'"},
			Command{User: "git", Host: "github.com", Service: UploadPack, Path: "a/b", Repo: "a/b"}},
	}
	for _, c := range ok {
		got, err := ParseCommand(c.args)
		if err != nil {
			t.Errorf("ParseCommand(%q): %v", c.args, err)
			continue
		}
		if got != c.want {
			t.Errorf("ParseCommand(%q) = %+v, want %+v", c.args, got, c.want)
		}
	}
	bad := []struct {
		name string
		args []string
	}{
		{"shell", []string{"git@github.com"}},
		{"sh", []string{"git@github.com", "sh"}},
		{"sh -c", []string{"git@github.com", "sh -c id"}},
		{"sftp subsystem", []string{"-s", "git@github.com", "sftp"}},
		{"sftp as sftp runs it", []string{"-oForwardX11 no", "-oForwardAgent no", "-oPermitLocalCommand no", "-oClearAllForwardings yes", "-s", "git@github.com", "sftp"}},
		{"ProxyCommand option", []string{"-oProxyCommand=sh -c 'id>/tmp/x'", "git@github.com", "git-upload-pack 'a/b'"}},
		{"ProxyCommand split", []string{"-o", "ProxyCommand=nc x 22", "git@github.com", "git-upload-pack 'a/b'"}},
		{"ProxyCommand as host", []string{"-oProxyCommand=id", "git-upload-pack 'a/b'"}},
		{"ProxyCommand as user", []string{"-oProxyCommand=id@github.com", "git-upload-pack 'a/b'"}},
		{"ProxyCommand in the path", []string{"git@github.com", "git-upload-pack '-oProxyCommand=id'"}},
		{"ProxyCommand after the command", []string{"git@github.com", "git-upload-pack 'a/b'", "-oProxyCommand=id"}},
		{"extra argument", []string{"git@github.com", "git-upload-pack", "'a/b'"}},
		{"extra words", []string{"git@github.com", "git-upload-pack 'a/b' x"}},
		{"command chaining", []string{"git@github.com", "git-upload-pack 'a/b'; id"}},
		{"quote break", []string{"git@github.com", "git-upload-pack 'a/b'\\''; id'"}},
		{"other git command", []string{"git@github.com", "git-upload-archive 'a/b'"}},
		{"git space form", []string{"git@github.com", "git upload-pack 'a/b'"}},
		{"unquoted path", []string{"git@github.com", "git-upload-pack a/b"}},
		{"double quotes", []string{"git@github.com", "git-upload-pack \"a/b\""}},
		{"dotdot", []string{"git@github.com", "git-upload-pack '../b'"}},
		{"dotdot repo", []string{"git@github.com", "git-upload-pack 'a/..'"}},
		{"three levels", []string{"git@github.com", "git-upload-pack 'a/b/c'"}},
		{"home path", []string{"git@github.com", "git-upload-pack '~/a/b'"}},
		{"dollar", []string{"git@github.com", "git-upload-pack 'a/$b'"}},
		{"only .git", []string{"git@github.com", "git-upload-pack 'a/.git'"}},
		{"bad port", []string{"-p", "0", "git@github.com", "git-upload-pack 'a/b'"}},
		{"port with sign", []string{"-p", "+22", "git@github.com", "git-upload-pack 'a/b'"}},
		{"missing port", []string{"-p"}},
		{"other SendEnv", []string{"-o", "SendEnv=LD_PRELOAD", "git@github.com", "git-upload-pack 'a/b'"}},
		{"tunnel", []string{"-L", "1:2:3", "git@github.com", "git-upload-pack 'a/b'"}},
		{"identity", []string{"-i", "/root/.ssh/id", "git@github.com", "git-upload-pack 'a/b'"}},
		{"config file", []string{"-F", "/tmp/c", "git@github.com", "git-upload-pack 'a/b'"}},
		{"verbose", []string{"-v", "git@github.com", "git-upload-pack 'a/b'"}},
		{"host with option", []string{"-", "git-upload-pack 'a/b'"}},
		{"host with space", []string{"git@git hub.com", "git-upload-pack 'a/b'"}},
		{"user with dash", []string{"-l@github.com", "git-upload-pack 'a/b'"}},
		{"newline", []string{"git@github.com", "git-upload-pack 'a/b'\nid"}},
		{"nul", []string{"git@github.com\x00", "git-upload-pack 'a/b'"}},
		{"no args", nil},
		{"too many args", strings.Fields(strings.Repeat("-4 ", 20) + "github.com x")},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseCommand(c.args)
			if err == nil {
				t.Fatalf("ParseCommand(%q) = %+v, want a refusal", c.args, got)
			}
			if !errors.Is(err, errdefs.ErrRefused) {
				t.Errorf("error %v is not ErrRefused", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "nexus: refused: ") || strings.ContainsAny(msg, "\n\r\x00") {
				t.Errorf("refusal %q is not one nexus line", msg)
			}
		})
	}
}

func TestRemoteCommandIsRebuilt(t *testing.T) {
	c, err := ParseCommand([]string{"git@github.com", "git-receive-pack 'acme/app.git'"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.RemoteCommand(), "git-receive-pack 'acme/app.git'"; got != want {
		t.Fatalf("RemoteCommand = %q, want %q", got, want)
	}
}

var safeRemote = regexp.MustCompile(`^git-(upload|receive)-pack '/?[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/?'$`)

// FuzzParseCommand: whatever a guest sends, an accepted command rebuilds a remote command of
// safe characters for a policy-valid repo on a plain host name, and a refusal is one line.
func FuzzParseCommand(f *testing.F) {
	seeds := [][]string{
		{"git@github.com", "git-upload-pack 'acme/app.git'"},
		{"-o", "SendEnv=GIT_PROTOCOL", "-p", "22", "git@github.com", "git-receive-pack 'acme/app'"},
		{"-oProxyCommand=id", "git@github.com", "git-upload-pack 'a/b'"},
		{"-s", "git@github.com", "sftp"},
		{"git@github.com", "sh"},
		{"git@github.com", "git-upload-pack 'a/b'\\''; id'"},
	}
	for _, s := range seeds {
		f.Add(strings.Join(s, "\x1f"))
	}
	f.Fuzz(func(t *testing.T, joined string) {
		args := strings.Split(joined, "\x1f")
		c, err := ParseCommand(args)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\n\r\x00") || !strings.HasPrefix(err.Error(), "nexus: refused: ") {
				t.Fatalf("refusal is not one nexus line: %q", err.Error())
			}
			return
		}
		if !safeRemote.MatchString(c.RemoteCommand()) || strings.Contains(c.Path, "..") {
			t.Fatalf("accepted unsafe remote command %q", c.RemoteCommand())
		}
		if r, ok := httppolicy.ParseRepo(c.Repo); !ok || r != c.Repo {
			t.Fatalf("accepted repo %q is not owner/repo", c.Repo)
		}
		if !hostRE.MatchString(c.Host) || strings.HasPrefix(c.User, "-") {
			t.Fatalf("accepted destination %q@%q", c.User, c.Host)
		}
		for _, a := range args {
			if strings.Contains(strings.ToLower(a), "proxycommand") {
				t.Fatalf("accepted %q", args)
			}
		}
	})
}
