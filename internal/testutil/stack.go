package testutil

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

var buildOnce struct {
	sync.Once
	dir string
	err error
}

// Binaries returns a directory holding nexus and nexus-agent: $NEXUS_BIN_DIR when set (make
// test builds them first), otherwise built once per test process from this module.
func Binaries() (string, error) {
	if d := os.Getenv("NEXUS_BIN_DIR"); d != "" {
		return d, nil
	}
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildOnce.err = err
			return
		}
		dir, err := os.MkdirTemp("", "nexus-bin-")
		if err == nil {
			// 0755 as bin/ is: the vmm runs nexus as another user (virtiofsd as a share's owner).
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			buildOnce.err = err
			return
		}
		agent := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, "nexus-agent"), "./services/vmm/agent/cmd/nexus-agent")
		agent.Dir, agent.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := agent.CombinedOutput(); err != nil {
			buildOnce.err = fmt.Errorf("build nexus-agent: %v: %s", err, out)
			return
		}
		main := exec.Command("go", "build", "-o", filepath.Join(dir, "nexus"), ".")
		main.Dir = root
		if out, err := main.CombinedOutput(); err != nil {
			buildOnce.err = fmt.Errorf("build nexus: %v: %s", err, out)
			return
		}
		buildOnce.dir = dir
	})
	return buildOnce.dir, buildOnce.err
}

var failpointOnce struct {
	sync.Once
	dir string
	err error
}

// FailpointBinaries returns a directory holding the crash tests' nexus (built with the tag
// nexus_failpoints, see pkg/failpoint) and nexus-agent: $NEXUS_BIN_DIR/failpoints when make
// build-e2e made it, otherwise built once per test process.
func FailpointBinaries() (string, error) {
	if d := os.Getenv("NEXUS_BIN_DIR"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "failpoints", "nexus")); err == nil {
			return filepath.Join(d, "failpoints"), nil
		}
	}
	failpointOnce.Do(func() {
		plain, err := Binaries()
		if err != nil {
			failpointOnce.err = err
			return
		}
		root, err := moduleRoot()
		if err != nil {
			failpointOnce.err = err
			return
		}
		dir, err := os.MkdirTemp("", "nexus-failpoints-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			failpointOnce.err = err
			return
		}
		agent, err := os.ReadFile(filepath.Join(plain, "nexus-agent"))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "nexus-agent"), agent, 0o755)
		}
		if err != nil {
			failpointOnce.err = err
			return
		}
		main := exec.Command("go", "build", "-tags", "nexus_failpoints", "-o", filepath.Join(dir, "nexus"), ".")
		main.Dir = root
		if out, err := main.CombinedOutput(); err != nil {
			failpointOnce.err = fmt.Errorf("build nexus with failpoints: %v: %s", err, out)
			return
		}
		failpointOnce.dir = dir
	})
	return failpointOnce.dir, failpointOnce.err
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the nexus module")
	}
	return filepath.Dir(mod), nil
}

// Stack is a whole nexus (`nexus up`) running as a child process in its own HOME and
// NEXUS_HOME, for end-to-end tests. Start one per test package in TestMain.
type Stack struct {
	Root    string // temp dir holding home/ and nexus/
	Home    home.Dir
	Bin     string // the nexus binary
	Env     []string
	URL     string
	upArgs  []string // flags of `nexus up` besides the log level
	netns   string   // the network namespace every command of the stack runs in; "": the caller's
	ready   func(*Stack) error
	cmd     *exec.Cmd
	log     *bytes.Buffer
	logFile *os.File
	logMu   sync.Mutex
	done    chan struct{}
	Started time.Time
}

// StartStack starts `nexus up` on a free port and waits for every service to answer. Each
// extra item is either a flag of `nexus up` ("--resolve=host=addr", "--extra-ca=file") or an
// environment entry (K=V) of the stack and of the commands run against it.
func StartStack(extra ...string) (*Stack, error) {
	bin, err := Binaries()
	if err != nil {
		return nil, err
	}
	return StartStackOf(bin, extra...)
}

// StartStackOf is StartStack with the nexus and nexus-agent binaries of dir (another build's,
// for an upgrade test).
func StartStackOf(bin string, extra ...string) (*Stack, error) {
	s, err := NewStack(StackOptions{Bin: bin, Extra: extra})
	if err != nil {
		return nil, err
	}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// StackOptions shape NewStack.
type StackOptions struct {
	// Bin is the directory of the nexus and nexus-agent binaries; empty: Binaries().
	Bin string
	// Netns is a network namespace (ip netns, see NewLAN) that `nexus up` and every CLI command
	// of the stack run in, through nsenter(1) (which leaves the mounts, /sys/fs/cgroup among
	// them, as they are). URL and Connect then name the namespace's loopback, out of the test
	// process's reach: run the CLI (Nexus) instead. Empty: the test's own namespace.
	Netns string
	// Ready says when Start has waited long enough; nil: once `nexus status` exits 0.
	Ready func(*Stack) error
	// Extra are flags of `nexus up` and K=V environment entries, as for StartStack.
	Extra []string
}

// NewStack prepares a stack (its temp HOME and NEXUS_HOME, its environment) without starting
// it, so that the CLI can set its home up first (nexus cluster init or join, say); Start
// starts it. The caller stops it with Stop.
func NewStack(o StackOptions) (*Stack, error) {
	bin := o.Bin
	if bin == "" {
		b, err := Binaries()
		if err != nil {
			return nil, err
		}
		bin = b
	}
	root, err := os.MkdirTemp("", "nexus-stack-")
	if err != nil {
		return nil, err
	}
	s := &Stack{Root: root, Home: home.Dir(filepath.Join(root, "nexus")), Bin: filepath.Join(bin, "nexus"), netns: o.Netns, ready: o.Ready}
	extra := o.Extra
	hh := filepath.Join(root, "home")
	os.MkdirAll(hh, 0o700)
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	env := []string{}
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "HOME", "NEXUS_HOME", "NEXUS_BUS_PORT", "NEXUS_BUS_URL", "NEXUS_CACHE":
			continue
		}
		env = append(env, kv)
	}
	s.Env = append(env, "HOME="+hh, "NEXUS_HOME="+string(s.Home), "NEXUS_BUS_PORT="+strconv.Itoa(port), "NEXUS_CACHE="+CacheDir())
	if os.Getenv("NEXUS_TEMPLATES") == "" {
		// Test stacks boot cold unless a package asks for templates (Warm, WarmCreate), as
		// most do: e2e/crash stays cold, since a template built in the background would share
		// the 2 CI cores with what it counts (QEMUs per home, kill points), and so do packages
		// with one or two creates of a shape, where the template's build costs what it saves.
		// Later entries win, so an extra can turn it on.
		s.Env = append(s.Env, "NEXUS_TEMPLATES=false")
	}
	for _, e := range extra {
		if strings.HasPrefix(e, "-") {
			s.upArgs = append(s.upArgs, e)
		} else {
			s.Env = append(s.Env, e)
		}
	}
	s.URL = fmt.Sprintf("nats://127.0.0.1:%d", port)
	return s, nil
}

// Start starts `nexus up` of a stack from NewStack and waits until it is ready.
func (s *Stack) Start() error { return s.start() }

// command is an exec.Cmd running the nexus binary with args, in the stack's namespace.
func (s *Stack) command(ctx context.Context, args ...string) *exec.Cmd {
	if s.netns == "" {
		return exec.CommandContext(ctx, s.Bin, args...)
	}
	// nsenter execs nexus in place, so the process (and its pid) is nexus itself.
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + filepath.Join("/run/netns", s.netns), "--", s.Bin}, args...)...)
}

func (s *Stack) start() error {
	if s.log == nil {
		s.log = &bytes.Buffer{} // kept across restarts: a leak scan must see every run's output
		// NEXUS_STACK_LOG=path also appends the stack's output to a file, to follow a long run.
		if p := os.Getenv("NEXUS_STACK_LOG"); p != "" {
			s.logFile, _ = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		}
	}
	s.cmd = s.command(context.Background(), append([]string{"up", "--log-level", "debug"}, s.upArgs...)...)
	s.cmd.Env = s.Env
	s.cmd.Stdout, s.cmd.Stderr = (*lockedWriter)(s), (*lockedWriter)(s)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	s.Started = time.Now()
	err := Poll(60*time.Second, func() error {
		select {
		case <-s.done:
			return errors.New("nexus up exited")
		default:
		}
		if s.ready != nil {
			return s.ready(s)
		}
		_, _, code := s.run(context.Background(), nil, "status")
		if code != 0 {
			return errors.New("not all services are up")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("stack did not come up: %v\n%s", err, s.Log())
	}
	return nil
}

type lockedWriter Stack

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.logMu.Lock()
	defer w.logMu.Unlock()
	if w.logFile != nil {
		w.logFile.Write(p)
	}
	return w.log.Write(p)
}

// Log is everything `nexus up` printed so far.
func (s *Stack) Log() string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return s.log.String()
}

// Kill kills `nexus up` with SIGKILL (its VMs keep running) and waits for it to exit.
func (s *Stack) Kill() {
	s.cmd.Process.Kill()
	<-s.done
}

// Shutdown stops `nexus up` the way an operator does (SIGTERM) and waits for it to exit; its
// VMs keep running for the next `nexus up` to adopt.
func (s *Stack) Shutdown() error {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return nil
	case <-time.After(30 * time.Second):
		s.Kill()
		return errors.New("nexus up did not exit within 30s of SIGTERM")
	}
}

// Exited is closed when `nexus up` has exited (a failpoint killed it, say).
func (s *Stack) Exited() <-chan struct{} { return s.done }

// Restart starts `nexus up` again on the same home.
func (s *Stack) Restart() error { return s.start() }

// Stop removes every sandbox, stops the stack and deletes its files.
func (s *Stack) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if s.cmd == nil { // prepared by NewStack, never started
		os.RemoveAll(s.Root)
		return
	}
	s.run(ctx, nil, "rm", "--force", "-l", "nexus-test")
	out, _, _ := s.run(ctx, nil, "ps", "-a", "--json")
	_ = out
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.killVMs()
	os.RemoveAll(s.Root)
}

// killVMs kills every VM of the stack's home: none may outlive the test run (a test that
// failed midway, a package about to time out).
func (s *Stack) killVMs() {
	pids, _ := filepath.Glob(filepath.Join(s.Home.Sandboxes(), "*", "qemu.pid"))
	for _, p := range pids {
		if b, err := os.ReadFile(p); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// Nexus runs the CLI against the stack and returns stdout, stderr and the exit code.
func (s *Stack) Nexus(t testing.TB, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return s.run(ctx, nil, args...)
}

// NexusIn is Nexus with stdin.
func (s *Stack) NexusIn(t testing.TB, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return s.run(ctx, stdin, args...)
}

// MustNexus runs the CLI and fails t unless it exits 0.
func (s *Stack) MustNexus(t testing.TB, args ...string) string {
	t.Helper()
	out, errOut, code := s.Nexus(t, args...)
	if code != 0 {
		t.Fatalf("nexus %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func (s *Stack) run(ctx context.Context, stdin []byte, args ...string) (string, string, int) {
	cmd := s.command(ctx, args...)
	cmd.Env = s.Env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else {
			code = -1
			errOut.WriteString(err.Error())
		}
	}
	return out.String(), errOut.String(), code
}

// Command returns an exec.Cmd for the CLI with the stack's environment (for pty tests).
func (s *Stack) Command(args ...string) *exec.Cmd {
	cmd := s.command(context.Background(), args...)
	cmd.Env = s.Env
	return cmd
}

// Connect connects to the stack's bus as user.
func (s *Stack) Connect(user string) (*nats.Conn, error) {
	return bus.Connect(context.Background(), bus.ConnectConfig{Home: s.Home, User: user, URL: s.URL})
}

func freePort() (int, error) { return BusPort() }

// BusPort picks a free port for a test's bus below Linux's ephemeral range (32768 and up): a bus
// restarted on its port must find it free, and a port the kernel hands out for outgoing
// connections can be taken meanwhile, even by a client connecting to itself (TCP self-connect)
// while it retries the dead bus.
func BusPort() (int, error) {
	for range 200 {
		port := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("testutil: no free port below the ephemeral range")
}

// Fixture is what an end-to-end package prepares before its stack starts: fake upstreams,
// servers, CA files. Dir is a temp dir removed after the run.
type Fixture struct {
	Dir      string
	env      []string
	flags    []string
	cleanups []func()
}

// Env adds K=V entries to the stack's environment.
func (f *Fixture) Env(kv ...string) { f.env = append(f.env, kv...) }

// WarmCreate turns on templates and warm create (off in test stacks unless asked for).
func (f *Fixture) WarmCreate() { f.Env("NEXUS_TEMPLATES=true") }

// Warm is the Option of Main that turns on warm create (Fixture.WarmCreate), the product's
// default: the first create of each shape boots cold and builds its template, later ones
// restore it. A test that needs a cold boot passes --cold.
func Warm() Option { return Setup(func(f *Fixture) error { f.WarmCreate(); return nil }) }

// Flags adds flags of `nexus up` ("--resolve=host=addr", "--extra-ca=file").
func (f *Fixture) Flags(args ...string) { f.flags = append(f.flags, args...) }

// Cleanup registers fn to run after the stack has stopped, last registered first.
func (f *Fixture) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

// Option shapes Main.
type Option func(*suite)

type suite struct {
	failpoints bool
	setup      []func(*Fixture) error
	started    []func(*Stack) error
	checks     []func(*Stack) error
}

// Failpoints runs the stack from the crash tests' build (FailpointBinaries).
func Failpoints() Option {
	return func(s *suite) { s.failpoints = true }
}

// Setup runs f before the stack starts (in order with other Setups); a failure ends the run.
func Setup(f func(*Fixture) error) Option {
	return func(s *suite) { s.setup = append(s.setup, f) }
}

// Started runs f once the stack answers, before the tests (e.g. to store a secret).
func Started(f func(*Stack) error) Option {
	return func(s *suite) { s.started = append(s.started, f) }
}

// Check runs f after the tests passed, while the stack still runs (e.g. a leak scan of its log
// and audit stream); an error fails the package.
func Check(f func(*Stack) error) Option {
	return func(s *suite) { s.checks = append(s.checks, f) }
}

// timeoutMargin is how long before the package's -timeout Main kills what it started.
const timeoutMargin = 30 * time.Second

// Main is the TestMain of an end-to-end package: it runs the Setups, starts one stack with
// their environment, points *s at it, runs the tests and the Checks, prints the tail of the
// stack's log when anything failed, stops the stack and runs the fixtures' cleanups. Without
// QEMU it exits 0 (the package is skipped), or 1 under CI.
func Main(m *testing.M, s **Stack, opts ...Option) {
	if err := QEMUAvailable(); err != nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "CI needs QEMU:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "skipping VM tests:", err)
		os.Exit(0)
	}
	var cfg suite
	for _, o := range opts {
		o(&cfg)
	}
	os.Exit(cfg.run(m, s))
}

func (cfg *suite) run(m *testing.M, s **Stack) int {
	dir, err := os.MkdirTemp("", "nexus-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f := &Fixture{Dir: dir}
	defer func() {
		for i := len(f.cleanups) - 1; i >= 0; i-- {
			f.cleanups[i]()
		}
		os.RemoveAll(dir)
	}()
	for _, setup := range cfg.setup {
		if err := setup(f); err != nil {
			fmt.Fprintln(os.Stderr, "e2e setup:", err)
			return 1
		}
	}
	bins, err := Binaries()
	if cfg.failpoints {
		bins, err = FailpointBinaries()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st, err := StartStackOf(bins, append(f.env, f.flags...)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*s = st
	defer st.Stop()
	// A package that runs out of -timeout panics without running any defer: its VMs (which
	// outlive nexus by design) would run on, holding CPU and whatever file descriptors the
	// test run inherited. Shortly before that, everything the package started is killed.
	flag.Parse()
	if tf := flag.Lookup("test.timeout"); tf != nil {
		if d, ok := tf.Value.(flag.Getter).Get().(time.Duration); ok && d > 2*timeoutMargin {
			watchdog := time.AfterFunc(d-timeoutMargin, func() {
				fmt.Fprintf(os.Stderr, "e2e: the package is %v from its -timeout: killing the stack and its VMs\n", timeoutMargin)
				st.cmd.Process.Kill()
				st.killVMs()
				for i := len(f.cleanups) - 1; i >= 0; i-- {
					f.cleanups[i]()
				}
			})
			defer watchdog.Stop()
		}
	}
	code := 0
	for _, started := range cfg.started {
		if err := started(st); err != nil {
			fmt.Fprintln(os.Stderr, "e2e setup:", err)
			code = 1
			break
		}
	}
	if code == 0 {
		code = m.Run()
	}
	if code == 0 {
		for _, check := range cfg.checks {
			if err := check(st); err != nil {
				fmt.Fprintln(os.Stderr, "FAIL:", err)
				code = 1
			}
		}
	}
	if code != 0 {
		log := st.Log()
		if len(log) > 20000 {
			log = log[len(log)-20000:]
		}
		fmt.Fprintf(os.Stderr, "---- nexus up log (tail) ----\n%s\n", log)
	}
	return code
}
