package stream_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/stream"
)

// A reader that stalls longer than PeerGone must not end the session (issue 18): pings are not
// held behind unread data, and what waits for the reader stays within the window.
func TestStalledReaderOutlivesPeerGone(t *testing.T) {
	oldPing, oldGone := stream.PingEvery, stream.PeerGone
	stream.SetPeerGone(3 * time.Second)
	defer func() { stream.PingEvery, stream.PeerGone = oldPing, oldGone }()
	for _, dir := range []struct {
		name string
		kind string
		// writer sends, reader stalls then reads
		clientWrites bool
	}{
		{"stdout", stream.KindStdout, false},
		{"stdin", stream.KindStdin, true},
	} {
		t.Run(dir.name, func(t *testing.T) {
			cli, srv := pair(t)
			writer, reader := srv, cli
			if dir.clientWrites {
				writer, reader = cli, srv
			}
			payload := make([]byte, 3*stream.Window+777)
			rand.Read(payload)
			wrote := make(chan error, 1)
			go func() {
				// In the small chunks of a guest's pipe, as exec sends them.
				var err error
				for p := payload; len(p) > 0 && err == nil; p = p[min(len(p), 16<<10):] {
					err = writer.Write(dir.kind, p[:min(len(p), 16<<10)])
				}
				if err == nil {
					err = writer.Send(stream.KindExit, map[string]int{"code": 0})
				}
				wrote <- err
			}()

			// The reader stalls for twice PeerGone; both sides must stay up, holding no
			// more than the window.
			stall := time.After(2 * stream.PeerGone)
			maxBuffered := int64(0)
		stalled:
			for {
				select {
				case <-stall:
					break stalled
				case <-reader.Done():
					t.Fatalf("the reader's session ended during the stall: %v", reader.Err())
				case <-writer.Done():
					t.Fatalf("the writer's session ended during the stall: %v", writer.Err())
				case err := <-wrote:
					t.Fatalf("the writer finished without the reader reading (err %v): no flow control", err)
				case <-time.After(10 * time.Millisecond):
					maxBuffered = max(maxBuffered, reader.Buffered())
				}
			}
			if maxBuffered > stream.Window {
				t.Fatalf("%d bytes buffered for a stalled reader, window is %d", maxBuffered, stream.Window)
			}
			if maxBuffered == 0 {
				t.Fatal("nothing reached the reader during the stall")
			}

			var got bytes.Buffer
			for {
				m, err := reader.Recv()
				if err != nil {
					t.Fatalf("after %d bytes: %v", got.Len(), err)
				}
				if m.Kind == dir.kind {
					got.Write(m.Data)
				}
				if n := reader.Buffered(); n > stream.Window {
					t.Fatalf("%d bytes buffered, window is %d", n, stream.Window)
				}
				if m.Kind == stream.KindExit {
					break
				}
			}
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), payload) {
				t.Fatalf("received %d bytes, want %d identical", got.Len(), len(payload))
			}
			srv.Close()
			cli.Close()
		})
	}
}

// Messages received before the peer closed are all read before Recv reports the close.
func TestCloseAfterQueuedMessages(t *testing.T) {
	cli, srv := pair(t)
	for i := range 10 {
		if err := srv.Write(stream.KindStdout, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	srv.Send(stream.KindExit, map[string]int{"code": 0})
	srv.Close()
	<-cli.Done()
	var got string
	for {
		m, err := cli.Recv()
		if err != nil {
			if !errors.Is(err, stream.ErrClosed) {
				t.Fatal(err)
			}
			break
		}
		got += string(m.Data)
		if m.Kind == stream.KindExit {
			got += "|exit"
		}
	}
	if got != `0123456789{"code":0}|exit` {
		t.Fatalf("read %q", got)
	}
}

// pair opens both sides of one session on a fresh bus.
func pair(t *testing.T) (cli, srv *stream.Session) {
	t.Helper()
	b := testutil.NewBus(t)
	sid := stream.NewID()
	cli, err := stream.Client(b.Connect(t, bus.UserCLI), sid)
	if err != nil {
		t.Fatal(err)
	}
	srv, err = stream.Server(b.Connect(t, bus.UserVMM), bus.LocalHost, sid)
	if err != nil {
		t.Fatal(err)
	}
	return cli, srv
}
