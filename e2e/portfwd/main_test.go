package portfwd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/portfwd"
)

// The whole stack runs once for the package, as separate `nexus serve` processes (the
// Procfile way) so a test can restart portfwd alone, in a temp NEXUS_HOME with its own HOME.

var (
	st       *stack
	setupErr error
)

// sandbox is the sandbox most tests use.
const sandbox = "pf"

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(func() int {
		if testutil.QEMUAvailable() != nil {
			return m.Run() // every test skips, or fails under CI, in need
		}
		st, setupErr = startStack()
		if st != nil {
			defer st.close()
		}
		if setupErr != nil {
			fmt.Fprintln(os.Stderr, "e2e/portfwd: stack did not start:", setupErr)
			if st != nil {
				st.dumpLogs()
			}
		}
		code := m.Run()
		if code != 0 && st != nil {
			st.dumpLogs()
		}
		return code
	}())
}

// need returns the running stack, or skips (fails when CI is set) without QEMU.
func need(t testing.TB) *stack {
	t.Helper()
	testutil.RequireQEMU(t)
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	return st
}

type stack struct {
	root, bin string
	env       []string
	procs     map[string]*exec.Cmd
	order     []string
	guestsrv  string
}

var services = []string{"bus", "gateway", "vmm", "netstack", "mitm", "credbroker", "gitrelay", "portfwd"}

func startStack() (*stack, error) {
	root, err := os.MkdirTemp("", "nxpf")
	if err != nil {
		return nil, err
	}
	s := &stack{root: root, procs: map[string]*exec.Cmd{}}
	for _, d := range []string{"home", "nexus", "logs"} {
		os.MkdirAll(filepath.Join(root, d), 0o700)
	}
	cache := testutil.CacheDir()
	busPort, err := testutil.BusPort()
	if err != nil {
		return s, err
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "HOME", "NEXUS_HOME", "NEXUS_CACHE", "NEXUS_BUS_PORT", "NEXUS_BUS_URL", "NEXUS_HOST":
			continue
		}
		s.env = append(s.env, kv)
	}
	s.env = append(s.env, "HOME="+filepath.Join(root, "home"), "NEXUS_HOME="+filepath.Join(root, "nexus"),
		"NEXUS_CACHE="+cache, "NEXUS_BUS_PORT="+strconv.Itoa(busPort))

	// The binaries under test, and the guest server built statically.
	bins, err := testutil.Binaries()
	if err != nil {
		return s, err
	}
	s.bin = bins
	s.guestsrv = filepath.Join(root, "guestsrv")
	build := exec.Command("go", "build", "-o", s.guestsrv, "./testdata/guestsrv")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return s, fmt.Errorf("go build guestsrv: %v\n%s", err, out)
	}
	for _, name := range services {
		if err := s.startService(name); err != nil {
			return s, err
		}
	}
	if err := testutil.Poll(60*time.Second, func() error { _, err := s.nexus("status"); return err }); err != nil {
		return s, fmt.Errorf("services did not come up: %w", err)
	}
	// 256 MiB, the size of TestConflictBetweenSandboxes's two: the template this cold boot
	// builds in the background restores both of them.
	if out, err := s.nexusT(5*time.Minute, "create", sandbox, "--image", "nexus-mini", "--memory", "256"); err != nil {
		return s, fmt.Errorf("create: %v: %s", err, out)
	}
	if out, err := s.nexus("cp", s.guestsrv, sandbox+":/tmp/guestsrv"); err != nil {
		return s, fmt.Errorf("cp guestsrv: %v: %s", err, out)
	}
	if out, err := s.nexus("exec", sandbox, "--", "sh", "-c", "/tmp/guestsrv >/dev/null 2>&1; true"); err != nil {
		return s, fmt.Errorf("warm guestsrv: %v: %s", err, out)
	}
	return s, nil
}

func (s *stack) startService(name string) error {
	log, err := os.OpenFile(filepath.Join(s.root, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(s.bin, "nexus"), "serve", name)
	cmd.Env, cmd.Stdout, cmd.Stderr = s.env, log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	go func() { cmd.Wait(); log.Close() }()
	if _, ok := s.procs[name]; !ok {
		s.order = append(s.order, name)
	}
	s.procs[name] = cmd
	if name == "bus" {
		// The others find the bus through the URL file it writes.
		return testutil.Poll(30*time.Second, func() error {
			_, err := os.Stat(filepath.Join(s.root, "nexus", "bus", "url"))
			return err
		})
	}
	return nil
}

// stopService ends one service with SIGTERM and waits for it.
func (s *stack) stopService(name string) {
	cmd := s.procs[name]
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	testutil.Poll(15*time.Second, func() error {
		if err := cmd.Process.Signal(syscall.Signal(0)); err == nil {
			return errors.New("still running")
		}
		return nil
	})
	cmd.Process.Kill()
}

func (s *stack) close() {
	// Sandboxes first: QEMU outlives the vmm by design.
	out, _ := s.nexus("ps", "-a", "--json")
	var list []struct{ Name string }
	json.Unmarshal([]byte(out), &list)
	for _, sb := range list {
		s.nexusT(time.Minute, "rm", "--force", sb.Name)
	}
	for i := len(s.order) - 1; i >= 0; i-- {
		s.stopService(s.order[i])
	}
	if os.Getenv("NEXUS_E2E_KEEP") == "" {
		os.RemoveAll(s.root)
	}
}

func (s *stack) dumpLogs() {
	for _, name := range []string{"gateway", "vmm", "portfwd"} {
		b, _ := os.ReadFile(filepath.Join(s.root, "logs", name+".log"))
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		fmt.Fprintf(os.Stderr, "---- %s log (tail) ----\n%s\n", name, b)
	}
}

func (s *stack) nexus(args ...string) (string, error) { return s.nexusT(time.Minute, args...) }

func (s *stack) nexusT(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "nexus"), args...)
	cmd.Env = s.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// guest runs a shell command in a sandbox and fails t if it fails.
func (s *stack) guest(t testing.TB, name, script string) string {
	t.Helper()
	out, err := s.nexus("exec", name, "--", "sh", "-c", script)
	if err != nil {
		t.Fatalf("exec %q in %s: %v: %s", script, name, err, out)
	}
	return out
}

// ports is `nexus ports [NAME] --json`.
func (s *stack) ports(name string) ([]api.Forward, error) {
	args := []string{"ports", "--json"}
	if name != "" {
		args = append(args, name)
	}
	out, err := s.nexus(args...)
	if err != nil {
		return nil, fmt.Errorf("nexus ports: %v: %s", err, out)
	}
	var list []api.Forward
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("nexus ports --json: %v: %s", err, out)
	}
	return list, nil
}

func (s *stack) forward(name string, port uint16) (api.Forward, error) {
	list, err := s.ports(name)
	if err != nil {
		return api.Forward{}, err
	}
	for _, f := range list {
		if f.Port == port {
			return f, nil
		}
	}
	return api.Forward{}, fmt.Errorf("port %d not in nexus ports %s: %+v", port, name, list)
}
