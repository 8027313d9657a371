package vmm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/agentproto"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/agent"
	"github.com/IniZio/nexus/services/vmm/guest"
)

// writeProcNet writes root/net/tcp listing the given ports as listening on 0.0.0.0.
func writeProcNet(t *testing.T, root string, ports ...uint16) {
	t.Helper()
	text := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	for i, p := range ports {
		text += fmt.Sprintf("%4d: 00000000:%04X 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 %d 1\n", i, p, 1000+i)
	}
	tmp := filepath.Join(root, "net", "tcp.new")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(root, "net", "tcp")); err != nil {
		t.Fatal(err)
	}
}

// oldAgent serves, on a unix socket, what an agent from before watch-listeners does with it
// and with listeners: it refuses the one as an unknown op and answers the other from root.
func oldAgent(t *testing.T, root string) string {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReader(c)
				nonce, err := agentproto.AwaitHello(br)
				if err != nil {
					return
				}
				c.Write(agentproto.Ready(nonce))
				sess, _ := yamux.Server(&bufConn{c, br}, agent.YamuxConfig())
				for {
					st, err := sess.AcceptStream()
					if err != nil {
						return
					}
					go func() {
						defer st.Close()
						var req agentproto.Request
						if agentproto.ReadMessage(st, &req) != nil {
							return
						}
						var resp agentproto.Response
						switch req.Op {
						case agentproto.OpPing:
							resp.Pong = &agentproto.Pong{Version: "old"}
						case agentproto.OpListeners:
							b, _ := os.ReadFile(filepath.Join(root, "net", "tcp"))
							resp.Listeners, _ = agentproto.ParseProcNetTCP(b, "tcp")
						default:
							resp = agentproto.ErrorResponse(errdefs.Invalid("unknown op %.40q", string(req.Op)))
						}
						agentproto.WriteMessage(st, resp)
					}()
				}
			}()
		}
	}()
	return sock
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// The vmm publishes a guest's forwardable listeners as they change, from an agent that pushes
// them and from an old one it has to ask, and an empty set when the machine stops.
func TestWatchListenersPublishesChanges(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "pushed", true: "old agent polled"}[old], func(t *testing.T) {
			root := t.TempDir()
			os.MkdirAll(filepath.Join(root, "net"), 0o755)
			writeProcNet(t, root, 3000, 22)
			var sock string
			if old {
				sock = oldAgent(t, root)
			} else {
				// Pushed: the vmm never asks, so the sets are the agent's alone.
				poll := ListenerPoll
				ListenerPoll = time.Hour
				t.Cleanup(func() { ListenerPoll = poll })
				srv, err := agent.New(agent.Config{Logger: zerolog.Nop(), ProcRoot: root,
					ListenerWatch: agent.ListenerWatch{Busy: time.Millisecond, BusyFor: time.Millisecond, Idle: 5 * time.Millisecond}})
				if err != nil {
					t.Fatal(err)
				}
				sock = filepath.Join(t.TempDir(), "agent.sock")
				l, err := net.Listen("unix", sock)
				if err != nil {
					t.Fatal(err)
				}
				actx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				go srv.Serve(actx, l)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ac, err := guest.Dial(ctx, sock)
			if err != nil {
				t.Fatal(err)
			}
			defer ac.Close()

			b := testutil.NewBus(t)
			events := make(chan []uint16, 64)
			sub, err := b.Connect(t, bus.UserPortfwd).Subscribe(portfwdapi.EventSubject("sb1"), func(msg *nats.Msg) {
				var ev portfwdapi.ListenersEvent
				if json.Unmarshal(msg.Data, &ev) != nil || ev.Type != portfwdapi.TypeListeners {
					return
				}
				var ports []uint16
				for _, p := range ev.Ports {
					ports = append(ports, p.Port)
				}
				events <- ports
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			s := &Service{cfg: Config{Bus: b.Connect(t, bus.UserVMM)}, log: zerolog.Nop()}
			m := &machine{id: "sb1", name: "p/sb1", dir: t.TempDir(), agent: ac}
			mctx, stop := context.WithCancel(ctx)
			watched := make(chan struct{})
			go func() { s.watchListeners(mctx, m); close(watched) }()

			// Each published set, in order, skipping republished copies of the one before.
			var prev []uint16
			next := func(want ...uint16) {
				t.Helper()
				for {
					select {
					case got := <-events:
						if slices.Equal(got, prev) && !slices.Equal(got, want) {
							continue
						}
						if !slices.Equal(got, want) {
							t.Fatalf("published %v, want %v", got, want)
						}
						prev = got
						return
					case <-ctx.Done():
						t.Fatalf("no set %v published", want)
					}
				}
			}
			next(3000) // 22 is below the forwarded range
			writeProcNet(t, root, 3000, 5173)
			next(3000, 5173)
			writeProcNet(t, root)
			next()
			writeProcNet(t, root, 8080)
			next(8080)
			stop()
			<-watched
			next()
		})
	}
}
