package agent

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// maxProcNetBytes bounds how much of /proc/net/tcp{,6} is read.
const maxProcNetBytes = 8 << 20

func (s *Server) listeners() ([]agentproto.Listener, error) {
	var out []agentproto.Listener
	for _, proto := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join(s.cfg.ProcRoot, "net", proto))
		if err != nil {
			if proto == "tcp6" && os.IsNotExist(err) {
				continue // no IPv6 in this kernel
			}
			return nil, fmt.Errorf("listeners: %w", err)
		}
		data, err := io.ReadAll(io.LimitReader(f, maxProcNetBytes))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("listeners: %w", err)
		}
		ls, err := agentproto.ParseProcNetTCP(data, proto)
		if err != nil {
			return nil, fmt.Errorf("listeners: %w", err)
		}
		out = append(out, ls...)
	}
	return out, nil
}

// ListenerWatch paces watch-listeners. The agent looks at the guest's listening sockets when
// the host pings it (its heartbeat: the guest is awake then anyway), every Busy for BusyFor
// after an exec starts or ends (servers start and stop then), and after Idle without any of
// those. Each look costs an idle guest a wakeup and, under TCG, milliseconds of host CPU.
type ListenerWatch struct {
	Busy, BusyFor, Idle time.Duration
}

// DefaultListenerWatch is the pace of a Config that sets none.
var DefaultListenerWatch = ListenerWatch{Busy: 250 * time.Millisecond, BusyFor: 10 * time.Second, Idle: 10 * time.Second}

// lookAgain makes the listener watchers look now; exec says an exec started or ended, after
// which they look often for a while.
func (s *Server) lookAgain(exec bool) {
	s.mu.Lock()
	if exec {
		s.lastExec = time.Now()
	}
	close(s.look)
	s.look = make(chan struct{})
	s.mu.Unlock()
}

// handleWatchListeners serves watch-listeners: the guest's listeners now, then each changed
// set, until the host closes the stream or the session ends. A failure to read them is sent as
// the stream's last message.
func (s *Server) handleWatchListeners(ctx context.Context, st *yamux.Stream) {
	defer st.Close()
	closed := make(chan struct{})
	go func() { // the host sends nothing more: a read ends when it closes the stream
		io.Copy(io.Discard, io.LimitReader(st, 1))
		close(closed)
	}()
	var last []agentproto.Listener
	for first := true; ; first = false {
		// Taken before the look: a ping or exec during it makes the next one come at once.
		s.mu.Lock()
		kick := s.look
		s.mu.Unlock()
		ls, err := s.listeners()
		if err != nil {
			s.replyErr(st, err)
			return
		}
		slices.SortFunc(ls, compareListeners)
		ls = slices.Compact(ls)
		if first || !slices.Equal(ls, last) {
			st.SetWriteDeadline(time.Now().Add(requestTimeout))
			if err := agentproto.WriteMessage(st, agentproto.Response{Listeners: ls}); err != nil {
				return
			}
			last = ls
		}
		s.mu.Lock()
		pace := s.cfg.ListenerWatch
		wait := pace.Idle
		if time.Since(s.lastExec) < pace.BusyFor {
			wait = pace.Busy
		}
		s.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-closed:
		case <-st.Session().CloseChan():
		case <-kick:
		case <-t.C:
		}
		t.Stop()
		if ctx.Err() != nil || st.Session().IsClosed() {
			return
		}
		select {
		case <-closed:
			return
		default:
		}
	}
}

func compareListeners(a, b agentproto.Listener) int {
	if c := strings.Compare(a.Proto, b.Proto); c != 0 {
		return c
	}
	if c := strings.Compare(a.IP, b.IP); c != 0 {
		return c
	}
	return int(a.Port) - int(b.Port)
}
