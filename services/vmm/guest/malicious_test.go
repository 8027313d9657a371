package guest_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/services/vmm/agent"
	"github.com/IniZio/nexus/services/vmm/guest"
)

// fakeAgent accepts connections on a unix socket, does the handshake and answers ping properly;
// every other stream is handed to evil, which may write anything.
func fakeAgent(t *testing.T, evil func(st *yamux.Stream, req *agentproto.Request), onSession func(*yamux.Session)) string {
	sock := filepath.Join(shortTemp(t), "agent.sock")
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
				sess, _ := yamux.Server(&rw{Conn: c, r: br}, agent.YamuxConfig())
				if onSession != nil {
					go onSession(sess)
				}
				for {
					st, err := sess.AcceptStream()
					if err != nil {
						return
					}
					go func() {
						req, err := agentproto.ReadRequest(st)
						if err != nil {
							st.Close()
							return
						}
						if req.Op == agentproto.OpPing {
							agentproto.WriteMessage(st, agentproto.Response{Pong: &agentproto.Pong{Version: "evil"}})
							st.Close()
							return
						}
						evil(st, req)
					}()
				}
			}()
		}
	}()
	return sock
}

type rw struct {
	net.Conn
	r *bufio.Reader
}

func (c *rw) Read(p []byte) (int, error) { return c.r.Read(p) }

func frameHeader(t agentproto.FrameType, n uint32) []byte {
	b := []byte{byte(t), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], n)
	return b
}

func TestMaliciousAgent(t *testing.T) {
	sock := fakeAgent(t, func(st *yamux.Stream, req *agentproto.Request) {
		switch req.Exec.Argv[0] {
		case "giant-response":
			var hdr [4]byte
			binary.BigEndian.PutUint32(hdr[:], 0xfffffff0)
			st.Write(hdr[:])
		case "giant-frame":
			agentproto.WriteMessage(st, agentproto.Response{})
			st.Write(frameHeader(agentproto.FrameStdout, 0x7fffffff))
			st.Write(make([]byte, 1<<20)) // and then some
		case "bad-type":
			agentproto.WriteMessage(st, agentproto.Response{})
			st.Write(frameHeader(agentproto.FrameStdin, 3))
			st.Write([]byte("abc"))
		case "short-exit":
			agentproto.WriteMessage(st, agentproto.Response{})
			st.Write(frameHeader(agentproto.FrameExit, 2))
			st.Write([]byte{0, 1})
		case "garbage":
			agentproto.WriteMessage(st, agentproto.Response{})
			st.Write([]byte("\xde\xad\xbe\xef garbage garbage"))
		case "eof":
			agentproto.WriteMessage(st, agentproto.Response{})
			st.Write(frameHeader(agentproto.FrameStdout, 100))
			st.Write([]byte("only part"))
		case "bad-json":
			st.Write([]byte{0, 0, 0, 5})
			st.Write([]byte("{{{{{"))
		}
		st.Close()
	}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := guest.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, name := range []string{"giant-response", "giant-frame", "bad-type", "short-exit", "garbage", "eof", "bad-json"} {
		st, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{name}}, nil, io.Discard, io.Discard, nil)
		if err == nil {
			t.Fatalf("%s: no error, status %+v", name, st)
		}
		t.Logf("%s: %v", name, err)
	}
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 64<<20 {
		t.Fatalf("allocated %d bytes against a malicious agent", d)
	}
	// The session survives misbehaving streams.
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("ping after abuse: %v", err)
	}
}

func TestMaliciousAgentStreams(t *testing.T) {
	// The agent opens streams to the host with junk: the host must refuse them and stay up.
	done := make(chan error, 1)
	sock := fakeAgent(t, func(st *yamux.Stream, req *agentproto.Request) { st.Close() }, func(sess *yamux.Session) {
		var firstErr error
		for i := 0; i < 50; i++ {
			st, err := sess.OpenStream()
			if err != nil {
				firstErr = err
				break
			}
			switch i % 3 {
			case 0:
				st.Write([]byte{0xff, 0xff, 0xff, 0xff})
			case 1:
				agentproto.WriteMessage(st, agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Argv: []string{"x"}}})
			case 2:
				agentproto.WriteMessage(st, agentproto.Request{Op: agentproto.OpDialHost, Port: 22}) // no host dialer: refused
				var resp agentproto.Response
				if err := agentproto.ReadMessage(st, &resp); err != nil || resp.Error == "" {
					firstErr = errors.New("dial-host without a dialer was not refused")
				}
			}
			st.Close()
		}
		done <- firstErr
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := guest.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
}

// TestDialRetries: the socket appears late and the agent ignores the first handshake (as when
// the guest had not opened its port yet); Dial must reconnect and succeed.
func TestDialRetries(t *testing.T) {
	dir := shortTemp(t)
	sock := filepath.Join(dir, "agent.sock")
	srv, _ := agent.New(agent.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		time.Sleep(200 * time.Millisecond) // the socket does not exist yet when Dial starts
		l, err := net.Listen("unix", sock)
		if err != nil {
			return
		}
		defer l.Close()
		first, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, first) // swallow the hello: "lost" bytes
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("stale bytes from an old session\n\x00\x01"))
			go srv.ServeConn(ctx, c)
		}
	}()
	c, err := guest.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Agent().Version != agentproto.Version {
		t.Fatalf("pong %+v", c.Agent())
	}
	// Dial gives up cleanly when nothing answers.
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := guest.Dial(short, filepath.Join(dir, "nothing.sock")); err == nil {
		t.Fatal("dial to nothing succeeded")
	}
}
