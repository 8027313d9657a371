package exec_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

// stall is how long a reader stops reading: past peerGone, and past the 10 s the build before
// issue 18 waited, so this test fails there whatever the setting.
const stall = 12 * time.Second

// The guest command, its reader stalled, its stdin writer stalled, its caller killed, and the
// statuses of nexus's own failures, on one nexus-mini sandbox.
func TestExecStreams(t *testing.T) {
	const box = "exec/stall"
	stack.MustNexus(t, "create", box, "--image", "nexus-mini", "--memory", "256", "-l", "nexus-test=1")
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", box) })

	t.Run("stdout reader stalls past peer-gone", func(t *testing.T) {
		const size = 10000000
		cmd := stack.Command("exec", box, "--", "sh", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", size))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		first := make([]byte, 1)
		if _, err := io.ReadFull(out, first); err != nil {
			t.Fatalf("no output: %v (%s)", err, errOut.String())
		}
		time.Sleep(stall) // the reader stalls: that is the test
		n, _ := io.Copy(io.Discard, out)
		err = cmd.Wait()
		if err != nil || n+1 != size {
			t.Fatalf("exec with a reader stalled %s: %v, %d bytes of %d: %s", stall, err, n+1, size, errOut.String())
		}
	})

	t.Run("guest stdin reader stalls past peer-gone", func(t *testing.T) {
		in := bytes.Repeat([]byte("0123456789abcdef"), 10000000/16)
		out, errOut, code := stack.NexusIn(t, in, "exec", "-i", box, "--", "sh", "-c", fmt.Sprintf("sleep %d; wc -c", int(stall.Seconds())))
		if code != 0 || strings.TrimSpace(out) != fmt.Sprint(len(in)) {
			t.Fatalf("exec -i with the guest not reading for %s: exit %d, %q %q", stall, code, out, errOut)
		}
	})

	t.Run("a killed caller's command is killed", func(t *testing.T) {
		cmd := stack.Command("exec", box, "--", "sh", "-c", "echo $$ > /tmp/victim; echo started; exec sleep 600")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "started\n" {
			t.Fatalf("exec did not start: %q %v", line, err)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		testutil.WaitFor(t, peerGone+20*time.Second, func() error {
			o, e, code := stack.Nexus(t, "exec", box, "--", "sh", "-c", `kill -0 "$(cat /tmp/victim)" 2>/dev/null && echo alive || echo gone`)
			if code != 0 {
				return fmt.Errorf("exec: %d %s", code, e)
			}
			if strings.TrimSpace(o) != "gone" {
				return fmt.Errorf("the command of a killed caller still runs")
			}
			return nil
		})
	})

	t.Run("statuses", func(t *testing.T) {
		if _, _, code := stack.Nexus(t, "exec", box, "--", "sh", "-c", "exit 3"); code != 3 {
			t.Fatalf("exit 3 in the guest: nexus exited %d", code)
		}
		if _, errOut, code := stack.Nexus(t, "exec", "exec/nosuch", "--", "true"); code != 125 {
			t.Fatalf("exec in a missing sandbox: exit %d, want 125 (%s)", code, errOut)
		}
		stack.MustNexus(t, "stop", box)
		if _, errOut, code := stack.Nexus(t, "exec", box, "--", "true"); code != 125 || !strings.Contains(errOut, "not running") {
			t.Fatalf("exec in a stopped sandbox: exit %d, want 125 (%s)", code, errOut)
		}
	})
}
