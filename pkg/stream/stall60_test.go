package stream_test

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/pkg/stream"
)

// The issue's own bound, at the real PeerGone: a reader of a 1 GB output (stdout) or a command
// that reads no stdin stalls for 60 s; both sessions stay up, the writer is held at the window,
// the process grows by at most 64 MiB, and the data flows again once the reader reads.
func TestReaderStalledSixtySeconds(t *testing.T) {
	const (
		stall  = 60 * time.Second
		offer  = 1 << 30 // what the writer would send, were it not held back
		chunk  = 16 << 10
		resume = 2 * stream.Window // read after the stall: more than one window must flow
	)
	if stream.PeerGone >= stall/2 {
		t.Fatalf("PeerGone is %v: a 60 s stall must outlast it", stream.PeerGone)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak sync.Mutex
	grewMost := int64(0)
	sample := func() {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak.Lock()
		grewMost = max(grewMost, int64(m.HeapInuse)-int64(before.HeapInuse))
		peak.Unlock()
	}
	t.Run("both", func(t *testing.T) { // returns when both parallel stalls have ended
		for _, dir := range []struct {
			name         string
			kind         string
			clientWrites bool
		}{
			{"stdout", stream.KindStdout, false},
			{"stdin", stream.KindStdin, true},
		} {
			cli, srv := pair(t)
			writer, reader := srv, cli
			if dir.clientWrites {
				writer, reader = cli, srv
			}
			t.Run(dir.name, func(t *testing.T) {
				t.Parallel()
				sent := make(chan int64, 1)
				go func() {
					buf := make([]byte, chunk)
					var n int64
					for n < offer && writer.Write(dir.kind, buf) == nil {
						n += chunk
					}
					sent <- n
				}()
				deadline := time.After(stall)
			stalled:
				for {
					select {
					case <-deadline:
						break stalled
					case <-reader.Done():
						t.Fatalf("the reader's session ended during the stall: %v", reader.Err())
					case <-writer.Done():
						t.Fatalf("the writer's session ended during the stall: %v", writer.Err())
					case n := <-sent:
						t.Fatalf("the writer stopped after %d bytes while the reader stalled", n)
					case <-time.After(100 * time.Millisecond):
						if b := reader.Buffered(); b > stream.Window {
							t.Fatalf("%d bytes buffered for a stalled reader, window is %d", b, stream.Window)
						}
						sample()
					}
				}
				var got int64
				for got < resume {
					m, err := reader.Recv()
					if err != nil {
						t.Fatalf("after the stall, %d bytes read: %v", got, err)
					}
					if m.Kind == dir.kind {
						got += int64(len(m.Data))
					}
				}
				reader.Close()
				writer.Close()
				if n := <-sent; n < resume || n >= offer {
					t.Fatalf("the writer sent %d bytes: want the window's worth and what was read, not all %d", n, int64(offer))
				}
			})
		}
	})
	t.Logf("heap growth at most %.1f MiB while both readers stalled 60 s", float64(grewMost)/(1<<20))
	if grewMost > 64<<20 {
		t.Fatalf("the process grew by %d MiB while the readers stalled (bound 64 MiB)", grewMost>>20)
	}
}
