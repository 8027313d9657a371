package stream_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/stream"
)

func TestStreamDeliversInOrderUnderCredit(t *testing.T) {
	b := testutil.NewBus(t)
	sid := stream.NewID()
	cli, err := stream.Client(b.Connect(t, bus.UserCLI), sid)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 3*stream.Window+12345)
	rand.Read(payload)
	go func() {
		srv.Write(stream.KindStdout, payload)
		srv.Send(stream.KindExit, map[string]int{"code": 3})
		srv.Close()
	}()
	var got bytes.Buffer
	for {
		m, err := cli.Recv()
		if err != nil {
			if !errors.Is(err, stream.ErrClosed) {
				t.Fatal(err)
			}
			break
		}
		if m.Kind == stream.KindStdout {
			if len(m.Data) > stream.MaxChunk {
				t.Fatalf("chunk of %d bytes", len(m.Data))
			}
			got.Write(m.Data)
		}
		if m.Kind == stream.KindExit && string(m.Data) != `{"code":3}` {
			t.Fatalf("exit %s", m.Data)
		}
	}
	if !bytes.Equal(got.Bytes(), payload) {
		t.Fatalf("received %d bytes, want %d identical", got.Len(), len(payload))
	}
}

func TestWriterBlocksWithoutCredit(t *testing.T) {
	b := testutil.NewBus(t)
	sid := stream.NewID()
	if _, err := stream.Client(b.Connect(t, bus.UserCLI), sid); err != nil {
		t.Fatal(err)
	}
	srv, err := stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan int, 1)
	go func() {
		n := 0
		chunk := make([]byte, stream.MaxChunk)
		for n < 2*stream.Window {
			if srv.Write(stream.KindStdout, chunk) != nil {
				break
			}
			n += len(chunk)
			select {
			case wrote <- n:
			default:
				<-wrote
				wrote <- n
			}
		}
	}()
	// Nobody reads on the client: the writer must stop at the window.
	testutil.WaitFor(t, 5*time.Second, func() error {
		select {
		case n := <-wrote:
			wrote <- n
			if n == stream.Window {
				return nil
			}
			return errors.New("still writing")
		default:
			return errors.New("nothing written yet")
		}
	})
	time.Sleep(100 * time.Millisecond) // give a runaway writer the chance to show itself
	if n := <-wrote; n != stream.Window {
		t.Fatalf("writer sent %d bytes without credit, window is %d", n, stream.Window)
	}
	srv.Close()
}

func TestPeerGoneIsDetected(t *testing.T) {
	oldPing, oldGone := stream.PingEvery, stream.PeerGone
	stream.PingEvery, stream.PeerGone = 20*time.Millisecond, 200*time.Millisecond
	defer func() { stream.PingEvery, stream.PeerGone = oldPing, oldGone }()
	b := testutil.NewBus(t)
	sid := stream.NewID()
	cliConn := b.Connect(t, bus.UserCLI)
	if _, err := stream.Client(cliConn, sid); err != nil {
		t.Fatal(err)
	}
	srv, err := stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	cliConn.Close() // the CLI was killed
	select {
	case <-srv.Done():
		if !errors.Is(srv.Err(), stream.ErrPeerGone) {
			t.Fatalf("ended with %v", srv.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a vanished client was not noticed")
	}
}

// TestClientFindsTheServiceHost: a client's input sent before any service serves the session
// waits for it and reaches the one that does, on its host; a session id that is not one subject
// token (a wildcard would let a session listen to others') is refused on both sides.
func TestClientFindsTheServiceHost(t *testing.T) {
	b := testutil.NewBus(t)
	sid := stream.NewID()
	cli, err := stream.Client(b.Connect(t, bus.UserCLI), sid)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	sent := make(chan error, 1)
	go func() { sent <- cli.Write(stream.KindStdin, []byte("early")) }()
	srv, err := stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if m, err := srv.Recv(); err != nil || m.Kind != stream.KindStdin || string(m.Data) != "early" {
		t.Fatalf("the service got %s %q (%v); want the stdin sent before it served", m.Kind, m.Data, err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := srv.Write(stream.KindStdout, []byte("late")); err != nil {
		t.Fatal(err)
	}
	if m, err := cli.Recv(); err != nil || string(m.Data) != "late" {
		t.Fatalf("the client got %q (%v); want \"late\"", m.Data, err)
	}

	for _, bad := range []string{"*", ">", "a.b", "", strings.Repeat("x", 65)} {
		if _, err := stream.Server(b.Connect(t, bus.UserGateway), bus.LocalHost, bad); err == nil {
			t.Errorf("a service served session id %q", bad)
		}
		if _, err := stream.Client(b.Connect(t, bus.UserGateway), bad); err == nil {
			t.Errorf("a client opened session id %q", bad)
		}
	}
}

// TestClientKeepsToItsService: once a session's service has spoken, what another host's
// publisher sends on the same session id never reaches the client.
func TestClientKeepsToItsService(t *testing.T) {
	b := testutil.NewBus(t)
	sid := stream.NewID()
	cli, err := stream.Client(b.Connect(t, bus.UserCLI), sid)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv, err := stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.Write(stream.KindStdout, []byte("mine")); err != nil {
		t.Fatal(err)
	}
	if m, err := cli.Recv(); err != nil || string(m.Data) != "mine" {
		t.Fatalf("the client got %q (%v); want \"mine\"", m.Data, err)
	}
	// The gateway may publish anywhere: it stands in for an impostor on another host.
	impConn := b.Connect(t, bus.UserGateway)
	imp, err := stream.Server(impConn, "other", sid)
	if err != nil {
		t.Fatal(err)
	}
	defer imp.Close()
	if err := imp.Write(stream.KindStdout, []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if err := impConn.Flush(); err != nil { // the forgery is on its way to the client first
		t.Fatal(err)
	}
	if err := srv.Write(stream.KindStdout, []byte("still mine")); err != nil {
		t.Fatal(err)
	}
	if m, err := cli.Recv(); err != nil || string(m.Data) != "still mine" {
		t.Fatalf("the client got %q (%v); want \"still mine\", never another host's", m.Data, err)
	}
}

// A host that sees some of a client's session ids learns nothing of its next ones: each is
// random and none shares a prefix with the one before (nuid's shared 12 characters and
// counted up in the rest).
func TestNewIDIsUnpredictable(t *testing.T) {
	prev := stream.NewID()
	for range 1000 {
		id := stream.NewID()
		if err := stream.ValidID(id); err != nil {
			t.Fatalf("NewID %q: %v", id, err)
		}
		if len(id) < 22 {
			t.Fatalf("NewID %q has fewer than 22 characters (128 bits)", id)
		}
		if id[:8] == prev[:8] {
			t.Fatalf("NewID %q shares its first 8 characters with the one before, %q", id, prev)
		}
		prev = id
	}
}

// TestBoundClientHearsOnlyItsHost: a client bound to the session's host (the gateway names
// it) before anyone speaks ignores another host that speaks first on the same session id:
// the impostor gets none of its input and none of its own output reaches the client.
func TestBoundClientHearsOnlyItsHost(t *testing.T) {
	b := testutil.NewBus(t)
	sid := stream.NewID()
	cli, err := stream.Client(b.Connect(t, bus.UserCLI), sid)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := cli.Bind(bus.LocalHost); err != nil {
		t.Fatal(err)
	}
	// The gateway may publish anywhere: it stands in for a compromised vmm on host "other".
	impConn := b.Connect(t, bus.UserGateway)
	imp, err := stream.Server(impConn, "other", sid)
	if err != nil {
		t.Fatal(err)
	}
	defer imp.Close()
	if err := imp.Write(stream.KindStdout, []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if err := impConn.Flush(); err != nil { // the forgery reaches the client first
		t.Fatal(err)
	}
	srv, err := stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.Write(stream.KindStdout, []byte("real")); err != nil {
		t.Fatal(err)
	}
	if m, err := cli.Recv(); err != nil || string(m.Data) != "real" {
		t.Fatalf("the client got %q (%v); want \"real\", never another host's", m.Data, err)
	}
	if err := cli.Write(stream.KindStdin, []byte("secret")); err != nil {
		t.Fatal(err)
	}
	if m, err := srv.Recv(); err != nil || string(m.Data) != "secret" {
		t.Fatalf("the session's host got %q (%v); want \"secret\"", m.Data, err)
	}
	if n := imp.Buffered(); n != 0 {
		t.Fatalf("the impostor received %d bytes of the client's input", n)
	}
}

// TestBindFailsWhenAnotherHostSpokeFirst: a client that took another host for its peer before
// the gateway named the session's host fails with an error naming both, and returns nothing of
// what the impostor sent.
func TestBindFailsWhenAnotherHostSpokeFirst(t *testing.T) {
	b := testutil.NewBus(t)
	sid := stream.NewID()
	cli, err := stream.Client(b.Connect(t, bus.UserCLI), sid)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	imp, err := stream.Server(b.Connect(t, bus.UserGateway), "other", sid)
	if err != nil {
		t.Fatal(err)
	}
	defer imp.Close()
	if err := imp.Write(stream.KindStdout, []byte("forged")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if cli.Buffered() == 0 {
			return errors.New("the impostor's output has not reached the client")
		}
		return nil
	})
	srv, err := stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	err = cli.Bind(bus.LocalHost)
	if err == nil || !strings.Contains(err.Error(), "host "+bus.LocalHost) || !strings.Contains(err.Error(), "host other") {
		t.Fatalf("Bind after another host spoke: %v; want an error naming both hosts", err)
	}
	if m, rerr := cli.Recv(); rerr == nil || rerr.Error() != err.Error() {
		t.Fatalf("Recv after the failed Bind: %s %q (%v); want only the Bind error", m.Kind, m.Data, rerr)
	}
	if err := cli.Write(stream.KindStdin, []byte("secret")); err == nil {
		t.Fatal("a failed session still sends input")
	}
}

// TestBindKeepsWhatAnEndedSessionSent: a command that finished before the gateway's reply
// arrived (its host sent the output, the exit and the close) still has all of it read after
// the client binds to that host.
func TestBindKeepsWhatAnEndedSessionSent(t *testing.T) {
	b := testutil.NewBus(t)
	sid := stream.NewID()
	cli, err := stream.Client(b.Connect(t, bus.UserCLI), sid)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv, err := stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	srv.Write(stream.KindStdout, []byte("done"))
	srv.Send(stream.KindExit, map[string]int{"code": 0})
	srv.Close()
	<-cli.Done()
	if err := cli.Bind(bus.LocalHost); err != nil {
		t.Fatalf("Bind after the session's host ended it: %v", err)
	}
	if m, err := cli.Recv(); err != nil || string(m.Data) != "done" {
		t.Fatalf("the client got %q (%v); want \"done\"", m.Data, err)
	}
	if m, err := cli.Recv(); err != nil || m.Kind != stream.KindExit {
		t.Fatalf("the client got %s (%v); want the exit", m.Kind, err)
	}
}

// TestFollowHearsOneHost: a progress follower hears the named host's .out only, or without a
// name the first host heard: another host's messages on the same session id are dropped.
func TestFollowHearsOneHost(t *testing.T) {
	b := testutil.NewBus(t)
	cli := b.Connect(t, bus.UserCLI)
	pub := b.Connect(t, bus.UserGateway) // publishes on any host's streams, in this order
	for _, c := range []struct {
		host string
		sent [][2]string // host, data
		want string
	}{
		{bus.LocalHost, [][2]string{{"other", "x"}, {bus.LocalHost, "y"}, {"other", "z"}, {bus.LocalHost, "end"}}, "y end"},
		{"", [][2]string{{"other", "a"}, {bus.LocalHost, "b"}, {"other", "end"}}, "a end"},
	} {
		sid := stream.NewID()
		got := make(chan string, 8)
		sub, err := stream.Follow(cli, c.host, sid, func(data []byte) { got <- string(data) })
		if err != nil {
			t.Fatal(err)
		}
		if err := cli.Flush(); err != nil {
			t.Fatal(err)
		}
		for _, m := range c.sent {
			if err := pub.Publish(stream.OutSubject(m[0], sid), []byte(m[1])); err != nil {
				t.Fatal(err)
			}
		}
		var heard []string
		for len(heard) == 0 || heard[len(heard)-1] != "end" {
			select {
			case s := <-got:
				heard = append(heard, s)
			case <-time.After(10 * time.Second):
				t.Fatalf("follow %q: heard only %q", c.host, heard)
			}
		}
		if strings.Join(heard, " ") != c.want {
			t.Errorf("follow %q heard %q; want %q", c.host, heard, c.want)
		}
		sub.Unsubscribe()
	}
	if _, err := stream.Follow(cli, "a.*", stream.NewID(), func([]byte) {}); err == nil {
		t.Error("Follow took a wildcard for a host")
	}
}
