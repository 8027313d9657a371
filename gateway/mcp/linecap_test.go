package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// zeros is n bytes of 'x', produced without holding them.
type zeros struct{ n int }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n == 0 {
		return 0, io.EOF
	}
	n := min(len(p), z.n)
	for i := range p[:n] {
		p[i] = 'x'
	}
	z.n -= n
	return n, nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// A 100 MB line is refused while it is read, with a JSON-RPC error for its id, and the server
// keeps serving the next line (issue 18: it was read whole, RSS 719 MiB).
func TestOverlongLineIsRefusedWhileRead(t *testing.T) {
	const huge = 100 << 20
	in := io.MultiReader(
		strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sandbox_exec","arguments":{"stdin":"`),
		&zeros{n: huge},
		strings.NewReader(`"}}}`+"\n"+`{"jsonrpc":"2.0","id":8,"method":"ping"}`+"\n"))
	srv, err := New(Config{Log: zerolog.Nop(), Dial: func(context.Context) (*nats.Conn, error) { return nil, errors.New("no bus") }})
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := srv.Serve(context.Background(), in, &out); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > huge/2 {
		t.Errorf("serving a %d-byte line allocated %d bytes: it was held whole", huge, grew)
	}
	answers := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(out.b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("stdout line %q: %v", line, err)
		}
		b, _ := json.Marshal(m["id"])
		answers[string(b)] = m
	}
	e, _ := answers["7"]["error"].(map[string]any)
	if e == nil || e["code"] != float64(-32600) || !strings.Contains(e["message"].(string), "longer than") {
		t.Fatalf("the over-long request 7 was answered %v", answers["7"])
	}
	if _, ok := answers["8"]["result"]; !ok {
		t.Fatalf("the request after it was not served: %v", answers)
	}
}
