package crash_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

// The stack killed while an exec waits behind a stalled stdin (the guest command reads none of
// it, so flow control holds the CLI's writes): the CLI ends with status 125 and one line, the
// guest command is killed (a retrying caller never runs it twice), and the sandbox execs again.
func TestCrashDuringStalledExec(t *testing.T) {
	startWitness(t)
	cmd := exec.Command(stack.Bin, "exec", "-i", witness, "--", "sh", "-c", "echo $$ > /root/stalled.pid; exec sleep 600")
	cmd.Env = stack.Env
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut strings.Builder
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var written atomic.Int64
	go func() {
		buf := make([]byte, 64<<10)
		for range 1024 { // 64 MiB, far more than any window lets through unread
			n, err := in.Write(buf)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
		in.Close()
	}()
	cliDone := make(chan error, 1)
	go func() { cliDone <- cmd.Wait() }()
	// Stalled: the guest command runs, and the writes stopped moving.
	testutil.WaitFor(t, time.Minute, func() error {
		if out, _, code := stack.Nexus(t, "exec", witness, "--", "cat", "/root/stalled.pid"); code != 0 || strings.TrimSpace(out) == "" {
			return errors.New("the guest command has not started")
		}
		before := written.Load()
		time.Sleep(500 * time.Millisecond) // a stall is measured over time
		if after := written.Load(); after != before || after == 0 {
			return fmt.Errorf("stdin still moves (%d bytes written)", after)
		}
		return nil
	})
	t.Logf("stdin stalled after %d bytes; killing the stack", written.Load())
	stack.Kill()
	if err := stack.Restart(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cliDone:
		var ee *exec.ExitError
		msg := strings.TrimSpace(errOut.String())
		if !errors.As(err, &ee) || ee.ExitCode() != vmmapi.ExitNexusFailed || msg == "" || strings.Contains(msg, "\n") {
			t.Errorf("exec cut off by the crash: %v, stderr %q; want status %d and one line", err, msg, vmmapi.ExitNexusFailed)
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("the exec still waits a minute after its stack was killed and restarted")
	}
	testutil.WaitFor(t, time.Minute, func() error {
		out, errOut, code := stack.Nexus(t, "exec", witness, "--", "sh", "-c", "kill -0 $(cat /root/stalled.pid) 2>/dev/null && echo alive || echo gone")
		if code != 0 || strings.TrimSpace(out) != "gone" {
			return fmt.Errorf("the stalled exec's guest command: %q (exit %d %s)", out, code, errOut)
		}
		return nil
	})
	checkConsistent(t)
}
