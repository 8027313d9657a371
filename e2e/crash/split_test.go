package crash_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/failpoint"
)

// splitServices are the services of the stack, each its own `nexus serve` process.
var splitServices = []string{"bus", "gateway", "vmm", "netstack", "mitm", "credbroker", "gitrelay", "portfwd"}

// supervisor runs each service as its own `nexus serve` process on the stack's home and starts
// again whichever exits, as the operator's supervisor (overmind, systemd) does.
type supervisor struct {
	mu      sync.Mutex
	procs   map[string]*exec.Cmd
	starts  map[string]int
	stopped bool
	wg      sync.WaitGroup
}

func (s *supervisor) run(t *testing.T, svc string) {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			return
		}
		cmd := exec.Command(stack.Bin, "serve", svc, "--log-level", "debug")
		cmd.Env = stack.Env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			s.mu.Unlock()
			t.Errorf("nexus serve %s: %v", svc, err)
			return
		}
		s.procs[svc] = cmd
		s.starts[svc]++
		s.mu.Unlock()
		cmd.Wait()
		time.Sleep(200 * time.Millisecond) // a supervisor's restart delay
	}
}

// startCount is how many times svc was started.
func (s *supervisor) startCount(svc string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts[svc]
}

// kill kills svc with SIGKILL and waits until the supervisor started it again and the stack
// answers.
func (s *supervisor) kill(t *testing.T, svc string) {
	t.Helper()
	s.mu.Lock()
	before := s.starts[svc]
	s.procs[svc].Process.Kill()
	s.mu.Unlock()
	s.waitRestarted(t, svc, before)
}

func (s *supervisor) waitRestarted(t *testing.T, svc string, before int) {
	t.Helper()
	testutil.WaitFor(t, time.Minute, func() error {
		if s.startCount(svc) == before {
			return fmt.Errorf("%s was not started again", svc)
		}
		if _, errOut, code := stack.Nexus(t, "status"); code != 0 {
			return fmt.Errorf("not every service is up: %s", errOut)
		}
		return nil
	})
}

func (s *supervisor) stop() {
	s.mu.Lock()
	s.stopped = true
	for _, cmd := range s.procs {
		cmd.Process.Kill()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// kill -9 of one service alone, the stack running as one process per service: each comes back,
// the operation it was in can be finished with one command, and the registry is true. A vmm
// killed mid-boot makes the create fail with the reason as soon as the vmm is back, instead of
// leaving it waiting for its whole deadline.
func TestKillOneService(t *testing.T) {
	box := take(t, 1)[0]
	stack.Kill()
	sup := &supervisor{procs: map[string]*exec.Cmd{}, starts: map[string]int{}}
	for _, svc := range splitServices {
		sup.wg.Add(1)
		go sup.run(t, svc)
		if svc == "bus" {
			time.Sleep(time.Second) // the others dial it; a supervisor would restart them anyway
		}
	}
	defer func() {
		sup.stop()
		if err := stack.Restart(); err != nil {
			t.Fatal(err)
		}
		checkConsistent(t)
		give(t, box)
	}()
	testutil.WaitFor(t, time.Minute, func() error {
		if _, errOut, code := stack.Nexus(t, "status"); code != 0 {
			return fmt.Errorf("not every service is up: %s", errOut)
		}
		return nil
	})
	checkConsistent(t)

	arm := func(point string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(stack.Home.Run(), failpoint.File), []byte(point+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("vmm during create", func(t *testing.T) {
		name := "crash/split-vmm"
		t.Cleanup(func() { stack.Nexus(t, "rm", "--force", name) })
		before := sup.startCount("vmm")
		arm("vmm/start/agent")
		out, errOut, code := stack.Nexus(t, createArgs(name)...)
		t.Logf("create while the vmm was killed: exit %d %s%s", code, out, errOut)
		if code == 0 {
			t.Fatalf("the create whose vmm was killed mid-boot succeeded")
		}
		sup.waitRestarted(t, "vmm", before)
		remember(t)
		checkConsistent(t)
		if s := find(t, name); s == nil || s.State != api.StateFailed || s.Reason == "" {
			t.Fatalf("after the vmm was killed during its create: %+v", s)
		}
		finishStart(t, name)
	})

	t.Run("gateway during start", func(t *testing.T) {
		stack.MustNexus(t, "stop", box)
		before := sup.startCount("gateway")
		arm("gateway/boot/vm")
		// The CLI whose gateway is killed under it notices within seconds (not at its own
		// deadline, minutes away) and says so in one line.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cli := exec.CommandContext(ctx, stack.Bin, "start", box)
		cli.Env = stack.Env
		var errOut strings.Builder
		cli.Stderr = &errOut
		if err := cli.Start(); err != nil {
			t.Fatal(err)
		}
		cliDone := make(chan error, 1)
		go func() { cliDone <- cli.Wait() }()
		sup.waitRestarted(t, "gateway", before)
		select {
		case err := <-cliDone:
			msg := strings.TrimSpace(errOut.String())
			if err == nil || strings.Contains(msg, "\n") || !strings.Contains(msg, "the gateway service") ||
				!strings.Contains(msg, "while it handled this request") {
				t.Errorf("start whose gateway was killed: %v, stderr %q; want one line saying what became of the gateway", err, msg)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("start still waits 30s after its gateway was killed and restarted")
		}
		cancel()
		checkConsistent(t)
		finishStart(t, box)
	})

	for _, svc := range []string{"netstack", "mitm", "vmm", "bus", "credbroker", "gitrelay", "portfwd"} {
		t.Run(svc, func(t *testing.T) {
			sup.kill(t, svc)
			testutil.WaitFor(t, time.Minute, func() error {
				if out, errOut, code := stack.Nexus(t, "exec", box, "--", "echo", "alive"); code != 0 || out != "alive\n" {
					return fmt.Errorf("exec after kill -9 of %s: exit %d %q %s", svc, code, out, errOut)
				}
				return nil
			})
			// The perimeter is back: the resolver answers (a refusal, audited).
			if out, _, _ := stack.Nexus(t, "exec", box, "--", "sh", "-c", "nslookup split.lost.example 2>&1"); !strings.Contains(out, "NXDOMAIN") {
				t.Errorf("after kill -9 of %s the sandbox's resolver does not answer: %q", svc, out)
			}
			checkConsistent(t)
		})
	}
}
