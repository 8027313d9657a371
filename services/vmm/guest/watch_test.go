package guest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/agent"
	"github.com/IniZio/nexus/services/vmm/guest"
)

// procNetTCP writes a /proc/net/tcp under root listing the given loopback ports as listening.
func procNetTCP(t *testing.T, root string, ports ...uint16) {
	t.Helper()
	text := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	for i, p := range ports {
		text += fmt.Sprintf("%4d: 0100007F:%04X 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 %d 1\n", i, p, 1000+i)
	}
	// Renamed into place: the agent never reads half a file.
	tmp := filepath.Join(root, "net", "tcp.new")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(root, "net", "tcp")); err != nil {
		t.Fatal(err)
	}
}

// The agent pushes the guest's listeners on watch-listeners: the set at once, then each change,
// and only changes; a ping or an exec makes it look again at once.
func TestWatchListenersPushesChanges(t *testing.T) {
	root := shortTemp(t)
	os.MkdirAll(filepath.Join(root, "net"), 0o755)
	procNetTCP(t, root, 3000)
	// Idle, the agent does not look again on its own within the test; after an exec, all the time.
	h := startAgent(t, agent.Config{ProcRoot: root, ListenerWatch: agent.ListenerWatch{Busy: time.Millisecond, BusyFor: time.Hour, Idle: time.Hour}})

	sets := make(chan []uint16, 16)
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		done <- h.client.WatchListeners(ctx, 0, func(ls []agentproto.Listener) {
			var ports []uint16
			for _, l := range ls {
				ports = append(ports, l.Port)
			}
			sets <- ports
		})
	}()
	next := func(want ...uint16) {
		t.Helper()
		select {
		case got := <-sets:
			if !slices.Equal(got, want) {
				t.Fatalf("pushed %v, want %v", got, want)
			}
		case err := <-done:
			t.Fatalf("watch ended: %v", err)
		case <-ctx.Done():
			t.Fatalf("no set %v pushed", want)
		}
	}
	next(3000)
	// The host's heartbeat makes the agent look again.
	procNetTCP(t, root, 3000, 4000)
	if _, err := h.client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	next(3000, 4000)
	// A server started by an exec: the exec makes the agent look again, and often for a while.
	procNetTCP(t, root, 4000, 5173)
	run(t, h.client, guest.ExecRequest{Argv: []string{"true"}}, nil)
	next(4000, 5173)
	procNetTCP(t, root)
	next()
	// While nothing changes nothing is pushed, however often the agent looks (an exec's time).
	run(t, h.client, guest.ExecRequest{Argv: []string{"true"}}, nil)
	procNetTCP(t, root, 8080)
	next(8080)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("watch ended with %v, want the caller's cancel", err)
	}
}

// An agent from before watch-listeners refuses it as an unknown op: the caller learns that
// (ErrInvalid, to fall back to asking) without being handed a set.
func TestWatchListenersOldAgent(t *testing.T) {
	sock := fakeAgent(t, func(st *yamux.Stream, req *agentproto.Request) {
		defer st.Close()
		agentproto.WriteMessage(st, agentproto.ErrorResponse(errdefs.Invalid("unknown op %.40q", string(req.Op))))
	}, nil)
	c, err := guest.Dial(ctxT(t), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.WatchListeners(ctxT(t), 0, func([]agentproto.Listener) { t.Error("an old agent handed a set") })
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("watch on an old agent: %v, want ErrInvalid", err)
	}
}
