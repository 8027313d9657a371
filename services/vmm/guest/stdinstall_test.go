package guest_test

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/services/vmm/agent"
	"github.com/IniZio/nexus/services/vmm/guest"
)

// A host that goes away (a vmm killed) while its exec's stdin is held back by a process that
// reads none of it: the agent kills the process, though it reads no more frames meanwhile, so
// a caller that retries never has it run twice.
func TestExecKilledWhenHostGoesWhileStdinStalls(t *testing.T) {
	h := startAgent(t, agent.Config{})
	s, err := h.client.StartExec(ctxT(t), guest.ExecRequest{Argv: []string{"sh", "-c", "echo $$; exec sleep 600"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
	if err != nil {
		t.Fatalf("pid %q: %v", ev.Data, err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	var written atomic.Int64
	go func() {
		chunk := make([]byte, 32<<10)
		for range 1024 { // 32 MiB: far past every window and queue
			if s.WriteStdin(chunk) != nil {
				return
			}
			written.Add(int64(len(chunk)))
		}
	}()
	testutil.WaitFor(t, 30*time.Second, func() error {
		before := written.Load()
		time.Sleep(300 * time.Millisecond)
		if after := written.Load(); after != before || after == 0 {
			return errors.New("stdin still moves")
		}
		return nil
	})
	h.client.Close() // the host is gone: its session with the agent ends
	testutil.WaitFor(t, 10*time.Second, func() error {
		if syscall.Kill(pid, 0) == nil {
			return errors.New("the guest process still runs after its host went away")
		}
		return nil
	})
}
