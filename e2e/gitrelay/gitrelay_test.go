package gitrelay_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gitrelay"
	"github.com/IniZio/nexus/pkg/audit"
)

const refusedMain = "nexus: refused: ref refs/heads/main not in allowed branches"

// create boots a nexus-base sandbox bound to acme/app, waits for the relay's socket, and removes
// the sandbox when t ends.
func create(t *testing.T, name string, args ...string) {
	t.Helper()
	start := time.Now()
	stack.MustNexus(t, append([]string{"create", name, "--image", "nexus-base", "--memory", "512", "-l", "nexus-test=1"}, args...)...)
	t.Logf("created %s in %.1fs", name, time.Since(start).Seconds())
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", name) })
	sock := filepath.Join(stack.Home.Sandbox(sandboxID(t, name)), api.SocketName)
	testutil.WaitFor(t, 15*time.Second, func() error {
		_, err := os.Stat(sock)
		return err
	})
}

func sandboxID(t *testing.T, name string) string {
	t.Helper()
	out := stack.MustNexus(t, "ps", "-a", "--json")
	var list []struct{ ID, Name string }
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v", err)
	}
	for _, s := range list {
		if s.Name == name || s.Name == "default/"+name {
			return s.ID
		}
	}
	t.Fatalf("no sandbox %s", name)
	return ""
}

const gitIdentity = "export GIT_AUTHOR_NAME=g GIT_AUTHOR_EMAIL=g@example.com GIT_COMMITTER_NAME=g GIT_COMMITTER_EMAIL=g@example.com; "

func sh(t *testing.T, name, script string) (string, string, int) {
	t.Helper()
	return stack.Nexus(t, "exec", name, "--", "sh", "-c", gitIdentity+script)
}

func mustSh(t *testing.T, name, script string) string {
	t.Helper()
	out, errOut, code := sh(t, name, script)
	if code != 0 {
		t.Fatalf("guest %s: %q: exit %d\nstdout: %s\nstderr: %s", name, script, code, out, errOut)
	}
	return out
}

// refsOf is a bare repo's refs, byte for byte: every loose ref file and packed-refs.
func refsOf(t *testing.T, bare string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(filepath.Join(bare, "refs"), func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			data, _ := os.ReadFile(p)
			fmt.Fprintf(&b, "%s\x00%s\x00", p, data)
		}
		return nil
	})
	data, _ := os.ReadFile(filepath.Join(bare, "packed-refs"))
	b.Write(data)
	return b.String()
}

// remoteCommands is every command the sshd ran so far.
func remoteCommands(t *testing.T) []string {
	data, _ := os.ReadFile(srv.cmdLog)
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

var gitCommandRE = regexp.MustCompile(`^git-(upload|receive)-pack '[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+'$`)

func events(t *testing.T, name string) []audit.Event {
	t.Helper()
	out := stack.MustNexus(t, "audit", "tail", "--sandbox", name, "--json")
	var evs []audit.Event
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev audit.Event
		if line != "" && json.Unmarshal([]byte(line), &ev) == nil {
			evs = append(evs, ev)
		}
	}
	return evs
}

func waitEvent(t *testing.T, name, what string, match func(audit.Event) bool) audit.Event {
	t.Helper()
	var found audit.Event
	err := testutil.Poll(15*time.Second, func() error {
		for _, ev := range events(t, name) {
			if ev.Layer == audit.LayerGit && match(ev) {
				found = ev
				return nil
			}
		}
		return fmt.Errorf("no git audit event: %s", what)
	})
	if err != nil {
		var b strings.Builder
		for _, ev := range events(t, name) {
			j, _ := json.Marshal(ev)
			b.WriteString("  " + string(j) + "\n")
		}
		t.Fatalf("%v; events:\n%s", err, b.String())
	}
	return found
}

func TestCloneFetchPush(t *testing.T) {
	name := "gr-push"
	create(t, name, "--repo", "acme/app")
	if out := mustSh(t, name, "echo $GIT_SSH_COMMAND"); strings.TrimSpace(out) != "/run/nexus/bin/nexus-agent ssh-shim" {
		t.Fatalf("GIT_SSH_COMMAND in the guest = %q", out)
	}
	bare := filepath.Join(srv.repos, "acme/app.git")

	mustSh(t, name, "git clone -q git@github.com:acme/app.git /root/app")
	if out := mustSh(t, name, "cat /root/app/README"); out != "hello from the remote\n" {
		t.Fatalf("cloned README = %q", out)
	}
	mustSh(t, name, "cd /root/app && git fetch -q origin && git status -sb | head -1")
	waitEvent(t, name, "clone allowed", func(ev audit.Event) bool {
		return ev.Decision == audit.Allow && ev.Method == "git-upload-pack" && ev.Host == "github.com" && ev.Path == "acme/app" && ev.Bytes > 0
	})

	// Push to nexus/x: accepted and on the remote.
	head := strings.TrimSpace(mustSh(t, name, "cd /root/app && echo x > x && git add x && git commit -q -m x && git push -q origin HEAD:nexus/x && git rev-parse HEAD"))
	out, err := runCmd(srv.gitEnv(), bare, "git", "rev-parse", "refs/heads/nexus/x")
	if err != nil || strings.TrimSpace(out) != head {
		t.Fatalf("remote nexus/x = %q (%v), want %s", out, err, head)
	}
	waitEvent(t, name, "push allowed", func(ev audit.Event) bool {
		return ev.Decision == audit.Allow && ev.Method == "git-receive-pack" && strings.Contains(ev.Reason, "refs/heads/nexus/x")
	})

	// Push to main: the exact line on git's stderr, and the remote's refs byte for byte the same.
	before := refsOf(t, bare)
	nBefore := len(remoteCommands(t))
	_, errOut, code := sh(t, name, "cd /root/app && git push origin HEAD:main")
	if code == 0 {
		t.Fatal("push to main succeeded")
	}
	if !containsLine(errOut, refusedMain) {
		t.Fatalf("push to main, stderr:\n%s", errOut)
	}
	t.Logf("push to main, git's stderr:\n%s", errOut)
	if after := refsOf(t, bare); after != before {
		t.Fatalf("the remote's refs changed:\nbefore %q\nafter  %q", before, after)
	}
	// The remote saw a receive-pack start (for the ref advertisement) and nothing else.
	if cmds := remoteCommands(t)[nBefore:]; len(cmds) != 1 || cmds[0] != "git-receive-pack 'acme/app.git'" {
		t.Errorf("remote commands for the refused push: %q", cmds)
	}
	waitEvent(t, name, "push to main denied", func(ev audit.Event) bool {
		return ev.Decision == audit.Deny && ev.Rule == "push_branch" && ev.Reason == refusedMain
	})

	// A tag, or main mixed with an allowed ref: refused the same way, nothing changes.
	_, errOut, code = sh(t, name, "cd /root/app && git push origin HEAD:nexus/y HEAD:refs/tags/v1")
	if code == 0 || !containsLine(errOut, "nexus: refused: ref refs/tags/v1 not in allowed branches") {
		t.Fatalf("mixed push: exit %d\n%s", code, errOut)
	}
	if after := refsOf(t, bare); after != before {
		t.Fatal("the remote's refs changed after a refused mixed push")
	}
}

func TestRefusals(t *testing.T) {
	name := "gr-refuse"
	create(t, name, "--repo", "acme/app")
	nBefore := len(remoteCommands(t))

	_, errOut, code := sh(t, name, "git clone git@github.com:acme/other.git /root/other")
	want := "nexus: refused by egress policy: github.com acme/other not in .nexus/config.yaml egress.policy"
	if code == 0 || !containsLine(errOut, want) {
		t.Fatalf("clone of a repo not in policy: exit %d\n%s", code, errOut)
	}
	waitEvent(t, name, "foreign repo denied", func(ev audit.Event) bool {
		return ev.Decision == audit.Deny && ev.Path == "acme/other" && ev.Reason == want
	})

	pwned := filepath.Join(srv.root, "pwned")
	for _, c := range []struct{ name, script string }{
		{"shell command", "$GIT_SSH_COMMAND git@github.com sh"},
		{"shell command line", "$GIT_SSH_COMMAND git@github.com 'sh -c id'"},
		{"interactive shell", "$GIT_SSH_COMMAND git@github.com </dev/null"},
		{"sftp", "printf '#!/bin/sh\\nexec /run/nexus/bin/nexus-agent ssh-shim \"$@\"\\n' > /tmp/ssh && chmod +x /tmp/ssh && echo ls | sftp -b - -S /tmp/ssh git@github.com"},
		{"sftp subsystem", "$GIT_SSH_COMMAND -s git@github.com sftp </dev/null"},
		{"ProxyCommand option", fmt.Sprintf("$GIT_SSH_COMMAND '-oProxyCommand=touch %s' git@github.com \"git-upload-pack 'acme/app.git'\" </dev/null", pwned)},
		{"ProxyCommand through git", fmt.Sprintf("GIT_SSH_COMMAND=\"$GIT_SSH_COMMAND '-oProxyCommand=touch %s'\" git clone git@github.com:acme/app.git /root/x", pwned)},
		{"upload-archive", "$GIT_SSH_COMMAND git@github.com \"git-upload-archive 'acme/app.git'\" </dev/null"},
		{"path injection", "$GIT_SSH_COMMAND git@github.com \"git-upload-pack 'acme/app.git'; touch /tmp/x\" </dev/null"},
	} {
		_, errOut, code := sh(t, name, c.script)
		if code == 0 || !strings.Contains(errOut, "nexus: refused: ") {
			t.Errorf("%s: exit %d, stderr:\n%s", c.name, code, errOut)
		}
	}
	if _, err := os.Stat(pwned); err == nil {
		t.Error("a ProxyCommand ran on the host")
	}
	if cmds := remoteCommands(t)[nBefore:]; len(cmds) != 0 && !(len(cmds) == 1 && cmds[0] == "") {
		t.Errorf("the remote ran commands for refused requests: %q", cmds)
	}
	for _, c := range remoteCommands(t) {
		if c != "" && !gitCommandRE.MatchString(c) {
			t.Errorf("the remote ran %q", c)
		}
	}
	waitEvent(t, name, "shell denied", func(ev audit.Event) bool {
		return ev.Decision == audit.Deny && ev.Rule == "git_ssh_command"
	})
}

func TestNoKeyMaterialInGuest(t *testing.T) {
	name := "gr-keys"
	create(t, name, "--repo", "acme/app")
	mustSh(t, name, "git clone -q git@github.com:acme/app.git /root/app") // the relay has been used
	env := mustSh(t, name, "env")
	if strings.Contains(env, "SSH_AUTH_SOCK") {
		t.Errorf("guest environment has SSH_AUTH_SOCK:\n%s", env)
	}
	// Text files with a PEM/OpenSSH private key block, anywhere on the guest's filesystem.
	out, _, code := sh(t, name, "grep -rlsI --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 'PRIVATE KEY' / ; true")
	if code != 0 {
		t.Fatalf("search failed")
	}
	if files := strings.TrimSpace(out); files != "" {
		t.Errorf("files in the guest mention PRIVATE KEY:\n%s", files)
	}
	// The search itself works: it finds a text the clone put on the guest's disk.
	out, _, _ = sh(t, name, "grep -rlsI --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 'hello from the remote' / ; true")
	if !strings.Contains(out, "/root/app/README") {
		t.Fatalf("the filesystem search does not find a known file: %q", out)
	}
	// The test key itself, in any file (binary ones included).
	out, _, _ = sh(t, name, fmt.Sprintf("grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev '%s' / ; true", srv.keyBody))
	if strings.TrimSpace(out) != "" {
		t.Errorf("the private key is in the guest: %s", out)
	}
	if out, _, _ := sh(t, name, "ls -a /root/.ssh 2>/dev/null"); strings.Contains(out, "id_") {
		t.Errorf("ssh identity in the guest: %s", out)
	}
}

func containsLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimRight(l, "\r") == line {
			return true
		}
	}
	return false
}

// TestConfigPolicy: a repo listed under egress.policy in .nexus/config.yaml (not bound with
// --repo) may be cloned over the relay.
func TestConfigPolicy(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(cfg, []byte("version: 1\negress:\n  policy:\n    github.com:\n      repos: [acme/other]\n"), 0o644)
	name := "gr-config"
	create(t, name, "--config", cfg)
	out := stack.MustNexus(t, "ps", "-a", "--json")
	if !strings.Contains(out, `"acme/other"`) {
		t.Skip("the gateway does not record the sandbox's .nexus/config.yaml yet")
	}
	mustSh(t, name, "git clone -q git@github.com:acme/other.git /root/other && test -f /root/other/README")
	_, errOut, code := sh(t, name, "git clone git@github.com:acme/app.git /root/app")
	want := "nexus: refused by egress policy: github.com acme/app not in .nexus/config.yaml egress.policy"
	if code == 0 || !containsLine(errOut, want) {
		t.Fatalf("clone of acme/app (not in this sandbox's policy): exit %d\n%s", code, errOut)
	}
}
