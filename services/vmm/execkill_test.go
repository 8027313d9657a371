package vmm

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/stream"
	"github.com/IniZio/nexus/services/vmm/agent"
	"github.com/IniZio/nexus/services/vmm/guest"
)

// The caller of an exec lost (its process killed: no goodbye on the stream) while the vmm and
// its session with the agent stay up, and while the guest command reads none of its stdin, so
// every window between them is full: the relay still gets the command killed (issue 18: a
// retrying caller never runs it twice). The kill cannot travel behind the stalled stdin.
func TestExecKilledWhenCallerGoesWhileStdinStalls(t *testing.T) {
	oldPing, oldGone := stream.PingEvery, stream.PeerGone
	stream.SetPeerGone(time.Second)
	defer func() { stream.PingEvery, stream.PeerGone = oldPing, oldGone }()

	// The real agent, on a unix socket, and the vmm's client of it.
	dir, err := os.MkdirTemp("", "execkill")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv, err := agent.New(agent.Config{Logger: zerolog.Nop(), Env: []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go srv.Serve(ctx, l)
	ac, err := guest.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()

	// The caller's stream over a real bus, relayed to a guest command that never reads.
	b := testutil.NewBus(t)
	sid := stream.NewID()
	callerConn := b.Connect(t, bus.UserCLI)
	caller, err := stream.Client(callerConn, sid)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	es, err := ac.StartExec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", "echo $$; exec sleep 600"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	relayed := make(chan struct{})
	go func() { relayExec(sess, es, 0); close(relayed) }()

	m, err := caller.Recv()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(m.Data)))
	if err != nil {
		t.Fatalf("pid %q: %v", m.Data, err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	var written atomic.Int64
	go func() {
		chunk := make([]byte, 32<<10)
		for range 2048 { // 64 MiB: far past every window and queue
			if caller.Write(stream.KindStdin, chunk) != nil {
				return
			}
			written.Add(int64(len(chunk)))
		}
	}()
	testutil.WaitFor(t, 30*time.Second, func() error {
		before := written.Load()
		time.Sleep(300 * time.Millisecond) // a stall is measured over time
		if after := written.Load(); after != before || after == 0 {
			return errors.New("stdin still moves")
		}
		return nil
	})
	t.Logf("stdin stalled after %d bytes", written.Load())

	callerConn.Close() // the caller is gone without a word; the vmm and the agent stay up
	testutil.WaitFor(t, 20*time.Second, func() error {
		if syscall.Kill(pid, 0) == nil {
			return errors.New("the guest command still runs after its caller went away")
		}
		return nil
	})
	select {
	case <-relayed:
	case <-time.After(20 * time.Second):
		t.Fatal("the relay of an exec whose caller is gone did not end")
	}
	if _, err := ac.Ping(ctx); err != nil {
		t.Fatalf("the agent's session did not survive: %v", err)
	}
}
