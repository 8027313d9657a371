// Package gitrelay_test proves the git SSH relay end to end: a whole nexus stack (`nexus up` in a
// temp home) whose gitrelay points github.com at a real Debian sshd on a loopback port
// (NEXUS_GITRELAY_HOSTS). The sshd has its own host key; the one authorized key lives only in an
// ssh-agent the test starts (its file is deleted once added), handed to the stack as
// SSH_AUTH_SOCK. Behind the sshd are bare repos; every command the sshd runs is logged, so a test
// sees exactly what reached the remote. Guests (nexus-base) run real git through the agent's
// ssh shim. Nothing here reads or writes the real ~/.ssh: HOME is a temp dir.
package gitrelay_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

var (
	stack *testutil.Stack
	srv   *sshServer
)

// sshServer is the fake github.com: sshd + ssh-agent + bare repos.
type sshServer struct {
	root     string
	port     int
	user     string
	repos    string
	cmdLog   string // every SSH_ORIGINAL_COMMAND the sshd ran, one per line
	agentSck string
	keyBody  string // a slice of the private key's base64 body: must never appear in a guest
	sshOpts  []string
	procs    []*exec.Cmd
}

func TestMain(m *testing.M) {
	testutil.Main(m, &stack, testutil.Warm(), testutil.Setup(func(f *testutil.Fixture) error {
		var err error
		srv, err = startSSHServer()
		if srv != nil {
			f.Cleanup(srv.stop)
		}
		if err != nil {
			return fmt.Errorf("e2e/gitrelay: ssh server: %w", err)
		}
		f.Env("SSH_AUTH_SOCK=" + srv.agentSck)
		f.Flags("--gitrelay-ssh-opts="+strings.Join(srv.sshOpts, " "),
			fmt.Sprintf("--gitrelay-hosts=github.com=%s@127.0.0.1:%d", srv.user, srv.port))
		return nil
	}))
}

func (s *sshServer) stop() {
	for _, p := range s.procs {
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			p.Process.Kill()
			<-done
		}
	}
	os.RemoveAll(s.root)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func runCmd(env []string, dir string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env, cmd.Dir = env, dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// gitEnv is the host-side environment for git in the test: temp HOME, no system config.
func (s *sshServer) gitEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(s.root, "home"), "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com"}
}

// directSSH is GIT_SSH_COMMAND for git on the host going straight to the sshd (the baseline).
func (s *sshServer) directSSH() string {
	return "ssh " + strings.Join(s.sshOpts, " ") + " -p " + strconv.Itoa(s.port)
}

func startSSHServer() (*sshServer, error) {
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		if sshd, err = exec.LookPath("/usr/sbin/sshd"); err != nil {
			return nil, errors.New("sshd not found (apt-get install openssh-server)")
		}
	}
	for _, b := range []string{"ssh", "ssh-agent", "ssh-add", "ssh-keygen", "git"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("%s not found", b)
		}
	}
	root, err := os.MkdirTemp("", "nexus-gitrelay-")
	if err != nil {
		return nil, err
	}
	u, err := user.Current()
	if err != nil {
		return nil, err
	}
	s := &sshServer{root: root, user: u.Username, repos: filepath.Join(root, "repos"), cmdLog: filepath.Join(root, "commands.log"),
		agentSck: filepath.Join(root, "agent.sock")}
	os.MkdirAll(filepath.Join(root, "home"), 0o700)
	env := s.gitEnv()
	if _, err := runCmd(env, root, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(root, "hostkey")); err != nil {
		return s, err
	}
	if _, err := runCmd(env, root, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nexus-test", "-f", filepath.Join(root, "clientkey")); err != nil {
		return s, err
	}
	priv, _ := os.ReadFile(filepath.Join(root, "clientkey"))
	lines := strings.Split(string(priv), "\n")
	if len(lines) < 3 {
		return s, errors.New("odd private key file")
	}
	s.keyBody = lines[2][:40] // the key-specific part (line 1 is a fixed OpenSSH header)
	pub, _ := os.ReadFile(filepath.Join(root, "clientkey.pub"))
	hostPub, _ := os.ReadFile(filepath.Join(root, "hostkey.pub"))
	if err := os.WriteFile(filepath.Join(root, "authorized_keys"), pub, 0o600); err != nil {
		return s, err
	}
	// The remote runs whatever it is asked to (no git-shell): what must not run is stopped by the
	// relay or not at all, and the log shows it.
	serve := filepath.Join(root, "serve.sh")
	os.WriteFile(serve, []byte(fmt.Sprintf(`#!/bin/sh
printf '%%s\n' "$SSH_ORIGINAL_COMMAND" >> %s
cd %s || exit 1
exec sh -c "$SSH_ORIGINAL_COMMAND"
`, s.cmdLog, s.repos)), 0o755)
	if s.port, err = freePort(); err != nil {
		return s, err
	}
	cfg := filepath.Join(root, "sshd_config")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %s
PidFile %s
AuthorizedKeysFile %s
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
PermitUserRC no
AllowUsers %s
AcceptEnv GIT_PROTOCOL
ForceCommand %s
LogLevel VERBOSE
`, s.port, filepath.Join(root, "hostkey"), filepath.Join(root, "sshd.pid"), filepath.Join(root, "authorized_keys"), s.user, serve)), 0o600)
	if os.Geteuid() == 0 {
		// sshd as root needs its privilege separation directory (the Debian unit creates it).
		os.MkdirAll("/run/sshd", 0o755)
	}
	d := exec.Command(sshd, "-D", "-e", "-f", cfg)
	d.Stdout, d.Stderr = openLog(filepath.Join(root, "sshd.log")), openLog(filepath.Join(root, "sshd.log"))
	if err := d.Start(); err != nil {
		return s, err
	}
	s.procs = append(s.procs, d)
	a := exec.Command("ssh-agent", "-D", "-a", s.agentSck)
	a.Env = env
	a.Stdout, a.Stderr = openLog(filepath.Join(root, "agent.log")), openLog(filepath.Join(root, "agent.log"))
	if err := a.Start(); err != nil {
		return s, err
	}
	s.procs = append(s.procs, a)
	agentEnv := append(env, "SSH_AUTH_SOCK="+s.agentSck)
	err = testutil.Poll(10*time.Second, func() error {
		_, err := runCmd(agentEnv, root, "ssh-add", filepath.Join(root, "clientkey"))
		return err
	})
	if err != nil {
		return s, err
	}
	// From here the key exists only inside the agent.
	os.Remove(filepath.Join(root, "clientkey"))
	known := filepath.Join(root, "known_hosts")
	os.WriteFile(known, []byte(fmt.Sprintf("[127.0.0.1]:%d %s", s.port, hostPub)), 0o644)
	s.sshOpts = []string{"-F", "/dev/null", "-o", "UserKnownHostsFile=" + known, "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=no"}
	// Bare repos: acme/app (bound in the tests), acme/other (never bound).
	seed := filepath.Join(root, "seed")
	os.MkdirAll(seed, 0o755)
	for _, c := range [][]string{{"init", "-q", "-b", "main"}, {"commit", "-q", "--allow-empty", "-m", "first"}} {
		if _, err := runCmd(env, seed, "git", c...); err != nil {
			return s, err
		}
	}
	os.WriteFile(filepath.Join(seed, "README"), []byte("hello from the remote\n"), 0o644)
	for _, c := range [][]string{{"add", "README"}, {"commit", "-q", "-m", "readme"}} {
		if _, err := runCmd(env, seed, "git", c...); err != nil {
			return s, err
		}
	}
	for _, r := range []string{"acme/app.git", "acme/other.git"} {
		if _, err := runCmd(env, root, "git", "clone", "-q", "--bare", seed, filepath.Join(s.repos, r)); err != nil {
			return s, err
		}
	}
	// The sshd answers with the agent's key.
	err = testutil.Poll(10*time.Second, func() error {
		_, err := runCmd(append(agentEnv, "GIT_SSH_COMMAND="+s.directSSH()), root, "git", "ls-remote", s.user+"@127.0.0.1:acme/app.git")
		return err
	})
	return s, err
}

func openLog(path string) *os.File {
	f, _ := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	return f
}

// randomFile writes n random bytes (incompressible, like a repo of binaries).
func randomFile(path string, n int) error {
	b := make([]byte, n)
	rand.Read(b)
	return os.WriteFile(path, b, 0o644)
}
