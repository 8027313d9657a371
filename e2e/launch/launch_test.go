package launch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// launched lists the sandboxes `agent launch` made (project launch), in any state.
func launched(t *testing.T) []api.SandboxView {
	t.Helper()
	out := stack.MustNexus(t, "ps", "-a", "--json")
	var list []api.SandboxView
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v: %s", err, out)
	}
	var mine []api.SandboxView
	for _, s := range list {
		if strings.HasPrefix(s.Name, "launch/") {
			mine = append(mine, s)
		}
	}
	return mine
}

// requireNoneLeft fails t if a launched sandbox or its directory (overlay, sockets, QEMU pid)
// is left on the host.
func requireNoneLeft(t *testing.T) {
	t.Helper()
	if l := launched(t); len(l) > 0 {
		t.Fatalf("launched sandboxes left behind: %+v", l)
	}
	dirs, _ := filepath.Glob(filepath.Join(stack.Home.Sandboxes(), "*", "qemu.pid"))
	if len(dirs) > 0 {
		t.Fatalf("VM directories left behind: %v", dirs)
	}
}

func TestRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"agent", "launch", "nexus-mini", "sh", "-c", "true"}, "COMMAND must be an absolute path"},
		{[]string{"herdr", "launch", "nexus-mini", "bin/sh"}, "COMMAND must be an absolute path"},
		{[]string{"agent", "launch", "--agent-egress", "nexus-mini", "/usr/local/bin/claude", "--dangerously-skip-permissions"}, "--dangerously-skip-permissions is refused"},
		{[]string{"herdr", "launch", "nexus-mini", "/bin/sh", "-c", "true", "--dangerously-skip-permissions"}, "--dangerously-skip-permissions is refused"},
		{[]string{"agent", "launch", "nexus-mini", "/usr/local/bin/claude", "--permission-mode", "bypassPermissions"}, "bypassPermissions is refused"},
		{[]string{"agent", "launch", "--agent", "nope", "nexus-mini", "/bin/true"}, `unknown agent profile "nope"`},
		{[]string{"agent", "launch", "nexus-nope", "/bin/true"}, `unknown image "nexus-nope"`},
	} {
		out, errOut, code := stack.Nexus(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 || out != "" {
			t.Errorf("nexus %s: exit %d, stdout %q, stderr %q; want exit 2 and one line containing %q", strings.Join(tc.args, " "), code, out, errOut, tc.want)
		}
	}
	requireNoneLeft(t)
}

func TestExitStatusAndRemoval(t *testing.T) {
	start := time.Now()
	out, errOut, code := stack.Nexus(t, "agent", "launch", "nexus-mini", "/bin/sh", "-c", "echo out; echo err >&2; exit 7")
	if code != 7 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("got exit %d, stdout %q, stderr %q; want 7, out, err", code, out, errOut)
	}
	t.Logf("exit 7 after %.1fs", time.Since(start).Seconds())
	requireNoneLeft(t)
	// Stdin is a pipe here: it reaches the command, which sees no terminal.
	out, _, code = stack.NexusIn(t, []byte("piped\n"), "herdr", "launch", "nexus-mini", "/bin/sh", "-c", "cat; [ -t 0 ] && echo tty || echo notty")
	if code != 0 || out != "piped\nnotty\n" {
		t.Fatalf("pipes: exit %d, stdout %q", code, out)
	}
	// A command that does not exist: a clear error, a failing status, nothing left.
	start = time.Now()
	_, errOut, code = stack.Nexus(t, "agent", "launch", "nexus-mini", "/no/such/program")
	t.Logf("missing program: exit %d after %.1fs: %s", code, time.Since(start).Seconds(), strings.TrimSpace(errOut))
	if code == 0 || errOut == "" {
		t.Fatalf("missing program: exit %d, stderr %q", code, errOut)
	}
	requireNoneLeft(t)
}

func TestNoEgressWithoutFlag(t *testing.T) {
	out, errOut, code := stack.Nexus(t, "agent", "launch", "-v", "nexus-mini", "/bin/sh", "-c", "ls /sys/class/net")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "eth") || !strings.Contains(out, "lo") {
		t.Fatalf("interfaces without --agent-egress: %q; want only lo", out)
	}
	// -v: boot steps and the perimeter, on stderr only.
	for _, want := range []string{"launching launch/", "egress mode    none", "network        none"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("-v stderr lacks %q:\n%s", want, errOut)
		}
	}
	if !regexp.MustCompile(`(?m)^  \S+\s+\d+\.\d\ds$`).MatchString(errOut) {
		t.Errorf("-v printed no boot step:\n%s", errOut)
	}
	requireNoneLeft(t)
}

func TestAgentEgressPerimeter(t *testing.T) {
	// The host's ~/.claude is live-mounted for claude-code; its settings declare auto mode.
	claudeDir := filepath.Join(stack.Root, "home", ".claude")
	os.MkdirAll(claudeDir, 0o700)
	os.WriteFile(filepath.Join(claudeDir, "settings.json"), []byte(`{"permissions":{"defaultMode":"auto"}}`), 0o600)
	script := `ls /sys/class/net | grep -q eth0 && echo nic
grep -rl -e bypassPermissions -e skipDangerousModePermissionPrompt /root /etc 2>/dev/null | sed 's/^/seeded: /'
echo done`
	out, errOut, code := stack.Nexus(t, "agent", "launch", "--agent-egress", "-v", "nexus-mini", "/bin/sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if out != "nic\ndone\n" {
		t.Fatalf("guest said %q; want a NIC and no seeded file naming bypassPermissions or skipDangerousModePermissionPrompt", out)
	}
	for _, want := range []string{"egress mode    curated", "api.anthropic.com", "network        curated"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("-v stderr lacks %q:\n%s", want, errOut)
		}
	}
	requireNoneLeft(t)
}

// TestCallerKilled: the launching CLI holds a lease; while it lives the sandbox stays past the
// grace period, and once it is killed with SIGKILL the gateway removes the sandbox and its VM.
func TestCallerKilled(t *testing.T) {
	cmd := stack.Command("agent", "launch", "nexus-mini", "/bin/sleep", "300")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	var sb api.SandboxView
	err := testutil.Poll(3*time.Minute, func() error {
		select {
		case <-exited:
			return fmt.Errorf("launch exited early: %s", stderr.String())
		default:
		}
		l := launched(t)
		if len(l) != 1 || l[0].State != api.StateRunning {
			return fmt.Errorf("launched: %+v", l)
		}
		sb = l[0]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Ephemeral {
		t.Fatalf("%s is not ephemeral", sb.Name)
	}
	pidB, err := os.ReadFile(filepath.Join(stack.Home.Sandbox(sb.ID), "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	qemuPID, _ := strconv.Atoi(strings.TrimSpace(string(pidB)))
	// Alive caller: the sandbox outlives the grace period and the lease TTL together.
	select {
	case <-exited:
		t.Fatalf("launch exited: %s", stderr.String())
	case <-time.After(time.Until(sb.StartedAt.Add(17 * time.Second))):
	}
	if l := launched(t); len(l) != 1 || l[0].ID != sb.ID || l[0].State != api.StateRunning {
		t.Fatalf("with its caller alive the sandbox should run on; launched: %+v", l)
	}

	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	err = testutil.Poll(20*time.Second, func() error {
		if l := launched(t); len(l) > 0 {
			return fmt.Errorf("still listed: %s %s", l[0].Name, l[0].State)
		}
		if err := syscall.Kill(qemuPID, 0); !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("QEMU %d still exists", qemuPID)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v after kill -9 of the caller", err)
	}
	t.Logf("sandbox %s and QEMU %d gone %.1fs after kill -9 of the caller", sb.Name, qemuPID, time.Since(killed).Seconds())
	requireNoneLeft(t)
}

// TestInterrupt: SIGINT to the launching CLI ends the command, removes the sandbox and exits.
func TestInterrupt(t *testing.T) {
	cmd := stack.Command("agent", "launch", "nexus-mini", "/bin/sleep", "300")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	err := testutil.Poll(3*time.Minute, func() error {
		if l := launched(t); len(l) != 1 || l[0].State != api.StateRunning {
			return fmt.Errorf("launched: %+v", l)
		}
		return nil
	})
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Fatalf("interrupted launch: %v; want a failing status (stderr %s)", err, stderr.String())
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("launch did not exit after SIGINT: %s", stderr.String())
	}
	requireNoneLeft(t)
}

// TestClaudeOnAgentBase launches the real Claude Code from nexus-agent-base. The image is built
// from Debian and the npm registry on first use (minutes); under CI a failed build fails.
func TestClaudeOnAgentBase(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nexus-agent-base")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, stack.Bin, "image", "build", "nexus-agent-base")
	build.Env = stack.Env
	if out, err := build.CombinedOutput(); err != nil {
		msg := fmt.Sprintf("nexus image build nexus-agent-base: %v: %s", err, lastLines(string(out), 5))
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	out, errOut, code := stack.Nexus(t, "agent", "launch", "--agent-egress", "--memory", "2048", "nexus-agent-base", "/usr/local/bin/claude", "--version")
	if code != 0 || !regexp.MustCompile(`\d+\.\d+\.\d+`).MatchString(out) {
		t.Fatalf("claude --version: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	t.Logf("claude --version in nexus-agent-base: %s", strings.TrimSpace(out))
	requireNoneLeft(t)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestTerminal: with a terminal on stdin the command gets a pty of the caller's size, and a
// resize of the caller's terminal reaches it.
func TestTerminal(t *testing.T) {
	cmd := stack.Command("agent", "launch", "nexus-mini", "/bin/sh", "-c",
		`[ -t 0 ] && echo "tty $(stty size)"; while read l; do [ "$l" = q ] && exit 3; echo "now $(stty size)"; done`)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var mu sync.Mutex
	var out bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	seen := func(s string) error {
		mu.Lock()
		defer mu.Unlock()
		if !strings.Contains(out.String(), s) {
			return fmt.Errorf("terminal shows %q; waiting for %q", out.String(), s)
		}
		return nil
	}
	if err := testutil.Poll(3*time.Minute, func() error { return seen("tty 30 100") }); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	// The CLI forwards SIGWINCH as a resize; each newline makes the script print the size.
	pty.Setsize(f, &pty.Winsize{Rows: 50, Cols: 132})
	if err := testutil.Poll(10*time.Second, func() error {
		f.Write([]byte("\r"))
		return seen("now 50 132")
	}); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	f.Write([]byte("q\r"))
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("launch: %v; want exit status 3", err)
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("launch did not exit")
	}
	requireNoneLeft(t)
}
