package gitrelay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	gwapi "github.com/IniZio/nexus/pkg/api/gateway"
	api "github.com/IniZio/nexus/pkg/api/gitrelay"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

// The relay tests run the service on a real bus (as the gitrelay user, so its permissions are
// exercised), real git on both ends, and for "ssh" a script that runs git-shell in a directory of
// bare repos. The guest side is this test binary re-executed as GIT_SSH_COMMAND: a copy of the
// agent's shim that dials the relay's socket directly instead of through the agent.

const shimEnv = "GITRELAY_TEST_SHIM_SOCKET"

func TestMain(m *testing.M) {
	if sock := os.Getenv(shimEnv); sock != "" {
		os.Exit(testShim(sock, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// testShim is the agent's ssh-shim minus the agent's host-dial handshake.
func testShim(sock string, args []string) int {
	if len(args) > 0 && args[0] == "-G" {
		return 0
	}
	for _, a := range args {
		if a == "-G" {
			return 0
		}
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test shim:", err)
		return 255
	}
	hello, _ := json.Marshal(api.Hello{Args: args, GitProtocol: os.Getenv("GIT_PROTOCOL")})
	api.WriteFrame(c, api.FrameHello, hello)
	go func() {
		if _, err := api.CopyFrames(c, api.FrameStdin, os.Stdin); err == nil {
			api.WriteFrame(c, api.FrameStdinEOF, nil)
		}
	}()
	fr := api.NewFrameReader(bufio.NewReaderSize(c, 128<<10))
	for {
		typ, p, err := fr.Next(api.MaxFrame)
		if err != nil {
			fmt.Fprintln(os.Stderr, "test shim: relay closed the connection")
			return 255
		}
		switch typ {
		case api.FrameStdout:
			os.Stdout.Write(p)
		case api.FrameStderr:
			os.Stderr.Write(p)
		case api.FrameExit:
			code, _ := api.ParseExit(p)
			return code
		}
	}
}

type capture struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (c *capture) Emit(_ context.Context, ev audit.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evs = append(c.evs, ev)
}

func (c *capture) find(match func(audit.Event) bool) (audit.Event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range c.evs {
		if match(ev) {
			return ev, true
		}
	}
	return audit.Event{}, false
}

type fixture struct {
	t       testing.TB
	home    home.Dir
	repos   string
	sock    string
	events  *capture
	work    string
	env     []string
	argLog  string
	fakeSSH string
	publish func(to gwapi.State)
}

func git(t testing.TB, dir string, env []string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

func mustGit(t testing.TB, dir string, env []string, args ...string) string {
	t.Helper()
	out, errOut, err := git(t, dir, env, args...)
	if err != nil {
		t.Fatalf("git %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// refsOf is the bare repo's refs, byte for byte (loose refs and packed-refs).
func refsOf(t *testing.T, bare string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(filepath.Join(bare, "refs"), func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			data, _ := os.ReadFile(p)
			fmt.Fprintf(&b, "%s %s", p, data)
		}
		return nil
	})
	data, _ := os.ReadFile(filepath.Join(bare, "packed-refs"))
	b.Write(data)
	return b.String()
}

func newFixture(t testing.TB) *fixture {
	if _, err := exec.LookPath("git-shell"); err != nil {
		t.Skip("git-shell not installed")
	}
	b := testutil.NewBus(t)
	root := t.TempDir()
	f := &fixture{t: t, home: b.Home, repos: filepath.Join(root, "repos"), events: &capture{}, work: filepath.Join(root, "work"),
		argLog: filepath.Join(root, "ssh-args")}
	os.MkdirAll(f.work, 0o755)
	hh := os.Getenv("HOME")
	f.env = []string{"HOME=" + hh, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com"}
	// Bare repos acme/app (bound) and acme/other (not), each with a main branch.
	seed := filepath.Join(root, "seed")
	os.MkdirAll(seed, 0o755)
	mustGit(t, seed, f.env, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(seed, "README"), []byte("hello\n"), 0o644)
	mustGit(t, seed, f.env, "add", "README")
	mustGit(t, seed, f.env, "commit", "-q", "-m", "first")
	for _, r := range []string{"acme/app.git", "acme/other.git"} {
		mustGit(t, root, f.env, "clone", "-q", "--bare", seed, filepath.Join(f.repos, r))
	}
	// The "ssh": records its argv, then runs what the relay asked for with git-shell.
	fakeSSH := filepath.Join(root, "ssh")
	os.WriteFile(fakeSSH, []byte(`#!/bin/sh
printf '%s\n' "$@" > "$ARG_LOG"
for last; do :; done
cd "$REPOS" && exec git-shell -c "$last"
`), 0o755)

	gw := b.Connect(t, bus.UserGateway)
	relayNC := b.Connect(t, bus.UserGitrelay)
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := New(Config{Bus: relayNC, Home: b.Home, Log: zerolog.Nop(), Audit: f.events,
		SSH: SSHConfig{Binary: fakeSSH, Env: []string{"PATH=" + os.Getenv("PATH"), "REPOS=" + f.repos, "ARG_LOG=" + f.argLog}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	// The gateway's side: a record and its running event.
	id := "sb1"
	os.MkdirAll(b.Home.Sandbox(id), 0o700)
	rec := gwapi.Sandbox{ID: id, Name: "default/dev", State: gwapi.StateRunning,
		Egress: gwapi.Egress{Mode: gwapi.EgressCurated, Repos: []string{"acme/app"}}}
	data, _ := json.Marshal(rec)
	kv, err := bus.KV(ctx, gw, bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, rec.Name, data); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(gw)
	f.publish = func(to gwapi.State) {
		ev, _ := json.Marshal(gwapi.Event{Type: "state", Sandbox: rec.Name, ID: id, To: to, Time: time.Now()})
		if _, err := js.Publish(ctx, gwapi.EventSubject(id), ev); err != nil {
			t.Fatal(err)
		}
	}
	f.publish(gwapi.StateRunning)
	f.sock = filepath.Join(b.Home.Sandbox(id), api.SocketName)
	testutil.WaitFor(t, 10*time.Second, func() error {
		c, err := net.Dial("unix", f.sock)
		if err != nil {
			return err
		}
		c.Close()
		return nil
	})
	exe, _ := os.Executable()
	f.fakeSSH = fakeSSH
	f.env = append(f.env, shimEnv+"="+f.sock, "GIT_SSH_COMMAND="+exe)
	return f
}

func TestRelayFetchAndPush(t *testing.T) {
	f := newFixture(t)
	clone := filepath.Join(f.work, "app")
	mustGit(t, f.work, f.env, "clone", "-q", "git@github.com:acme/app.git", clone)
	if b, _ := os.ReadFile(filepath.Join(clone, "README")); string(b) != "hello\n" {
		t.Fatalf("clone content %q", b)
	}
	args, _ := os.ReadFile(f.argLog)
	if !strings.Contains(string(args), "git-upload-pack 'acme/app.git'") || !strings.Contains(string(args), "\n-a\n") {
		t.Errorf("ssh argv:\n%s", args)
	}
	mustGit(t, clone, f.env, "fetch", "-q", "origin")
	if _, ok := f.events.find(func(ev audit.Event) bool {
		return ev.Decision == audit.Allow && ev.Method == UploadPack && ev.Path == "acme/app" && ev.Layer == audit.LayerGit && ev.Bytes > 0
	}); !ok {
		t.Errorf("no allow event for the clone: %+v", f.events.evs)
	}

	// Push to nexus/x works.
	os.WriteFile(filepath.Join(clone, "f"), []byte("x\n"), 0o644)
	mustGit(t, clone, f.env, "add", "f")
	mustGit(t, clone, f.env, "commit", "-q", "-m", "x")
	mustGit(t, clone, f.env, "push", "-q", "origin", "HEAD:refs/heads/nexus/x")
	bare := filepath.Join(f.repos, "acme/app.git")
	head := strings.TrimSpace(mustGit(t, clone, f.env, "rev-parse", "HEAD"))
	if got := strings.TrimSpace(mustGit(t, bare, f.env, "rev-parse", "refs/heads/nexus/x")); got != head {
		t.Fatalf("nexus/x = %s, want %s", got, head)
	}

	// Push to main is refused with the exact line; the remote's refs do not change.
	before := refsOf(t, bare)
	_, errOut, err := git(t, clone, f.env, "push", "origin", "HEAD:refs/heads/main")
	if err == nil {
		t.Fatal("push to main succeeded")
	}
	if !strings.Contains(errOut, "\nnexus: refused: ref refs/heads/main not in allowed branches\n") &&
		!strings.HasPrefix(errOut, "nexus: refused: ref refs/heads/main not in allowed branches\n") {
		t.Fatalf("push to main stderr:\n%s", errOut)
	}
	t.Logf("push to main, git's stderr:\n%s", errOut)
	if after := refsOf(t, bare); after != before {
		t.Fatalf("refs changed:\nbefore %s\nafter %s", before, after)
	}
	// A mixed push (one allowed ref, one not) changes nothing either.
	_, errOut, err = git(t, clone, f.env, "push", "origin", "HEAD:refs/heads/nexus/y", "HEAD:refs/tags/v1")
	if err == nil || !strings.Contains(errOut, "nexus: refused: ref refs/tags/v1 not in allowed branches") {
		t.Fatalf("mixed push: %v\n%s", err, errOut)
	}
	if after := refsOf(t, bare); after != before {
		t.Fatalf("refs changed by a refused mixed push")
	}
	if _, ok := f.events.find(func(ev audit.Event) bool {
		return ev.Decision == audit.Deny && ev.Rule == RulePushBranch && ev.Reason == "nexus: refused: ref refs/heads/main not in allowed branches"
	}); !ok {
		t.Errorf("no deny event for the push to main")
	}
}

func TestRelayRefusals(t *testing.T) {
	f := newFixture(t)
	_, errOut, err := git(t, f.work, f.env, "clone", "git@github.com:acme/other.git")
	want := "nexus: refused by egress policy: github.com acme/other not in .nexus/config.yaml egress.policy\n"
	if err == nil || !strings.Contains(errOut, want) {
		t.Fatalf("foreign clone: %v\n%s", err, errOut)
	}
	exe, _ := os.Executable()
	for _, c := range []struct {
		name string
		args []string
	}{
		{"shell", []string{"git@github.com", "sh"}},
		{"interactive", []string{"git@github.com"}},
		{"sftp", []string{"-s", "git@github.com", "sftp"}},
		{"ProxyCommand", []string{"-oProxyCommand=touch " + filepath.Join(f.work, "pwned"), "git@github.com", "git-upload-pack 'acme/app.git'"}},
	} {
		cmd := exec.Command(exe, c.args...)
		cmd.Env = f.env
		var errb bytes.Buffer
		cmd.Stderr = &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 255 || !strings.HasPrefix(errb.String(), "nexus: refused: ") {
			t.Errorf("%s: %v, stderr %q", c.name, err, errb.String())
		}
	}
	if _, err := os.Stat(filepath.Join(f.work, "pwned")); err == nil {
		t.Error("ProxyCommand ran")
	}
	if args, err := os.ReadFile(f.argLog); err == nil {
		t.Errorf("ssh ran for a refused request: %s", args)
	}
	if _, ok := f.events.find(func(ev audit.Event) bool {
		return ev.Decision == audit.Deny && ev.Rule == RuleRepo && ev.Path == "acme/other" && ev.Host == "github.com"
	}); !ok {
		t.Error("no deny event for the foreign repo")
	}
}

// TestRelayFollowsLifecycle: the socket goes away when the sandbox stops and comes back when
// it runs again.
func TestRelayFollowsLifecycle(t *testing.T) {
	f := newFixture(t)
	f.publish(gwapi.StateStopping)
	testutil.WaitFor(t, 10*time.Second, func() error {
		if _, err := os.Stat(f.sock); err == nil {
			return errors.New("socket still there")
		}
		return nil
	})
	f.publish(gwapi.StateStarting)
	f.publish(gwapi.StateRunning)
	testutil.WaitFor(t, 10*time.Second, func() error {
		_, err := os.Stat(f.sock)
		return err
	})
	mustGit(t, f.work, f.env, "ls-remote", "git@github.com:acme/app.git")
}

// BenchmarkRelayClone measures what the relay adds to a clone on the host alone (no VM): git
// through the shim, the relay and the "ssh" (git-shell) against git running the same "ssh"
// directly. Reported: ms per clone each way and the ratio.
func BenchmarkRelayClone(b *testing.B) {
	f := newFixture(b)
	// A 32 MiB repo of random blobs.
	big := filepath.Join(f.repos, "acme/app.git")
	work := b.TempDir()
	mustGit(b, work, f.env, "clone", "-q", big, "w")
	w := filepath.Join(work, "w")
	buf := make([]byte, 1<<20)
	for i := range 32 {
		rand.Read(buf)
		os.WriteFile(filepath.Join(w, fmt.Sprintf("blob-%02d", i)), buf, 0o644)
	}
	mustGit(b, w, f.env, "add", ".")
	mustGit(b, w, f.env, "commit", "-q", "-m", "big")
	mustGit(b, w, f.env, "push", "-q", big, "HEAD:refs/heads/main")
	mustGit(b, big, f.env, "repack", "-a", "-d", "-q") // clones then send the stored pack
	direct := append(append([]string{}, f.env...), "REPOS="+f.repos, "ARG_LOG="+filepath.Join(work, "args"), "GIT_SSH_COMMAND="+f.fakeSSH)
	var dDirect, dRelay time.Duration
	for _, c := range []struct {
		name string
		env  []string
		d    *time.Duration
	}{{"direct", direct, &dDirect}, {"relay", f.env, &dRelay}} {
		b.Run(c.name, func(b *testing.B) {
			var total time.Duration
			for i := 0; b.Loop(); i++ {
				dst := filepath.Join(b.TempDir(), "c")
				t0 := time.Now()
				mustGit(b, work, c.env, "clone", "-q", "--no-checkout", "git@github.com:acme/app.git", dst)
				total += time.Since(t0)
			}
			*c.d = total / time.Duration(b.N)
			b.ReportMetric(float64(c.d.Milliseconds()), "ms/clone")
		})
	}
	if dDirect > 0 {
		b.ReportMetric(float64(dRelay)/float64(dDirect), "relay/direct")
	}
}
