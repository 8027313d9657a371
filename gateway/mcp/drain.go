package mcp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// A client may write its requests and close stdin at once (`printf … | nexus mcp`). The stdio
// server ends the session, cancelling the calls still running, as soon as its input ends; so
// the end of stdin is held back until every request read has been answered on stdout.

// drainTimeout bounds how long the end of stdin waits for answers.
const drainTimeout = 10 * time.Minute

// inflight is the set of request ids read and not yet answered.
type inflight struct {
	mu      sync.Mutex
	ids     map[string]bool
	changed chan struct{} // closed and replaced on every answer
}

func newInflight() *inflight {
	return &inflight{ids: map[string]bool{}, changed: make(chan struct{})}
}

// jsonrpcLine is what the drain needs of a message: its id, and whether it is a request.
type jsonrpcLine struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
}

func (f *inflight) read(line []byte) {
	var m jsonrpcLine
	if json.Unmarshal(line, &m) != nil || m.Method == "" || len(m.ID) == 0 || string(m.ID) == "null" {
		return // not a request awaiting an answer
	}
	f.mu.Lock()
	f.ids[string(m.ID)] = true
	f.mu.Unlock()
}

func (f *inflight) written(line []byte) {
	var m jsonrpcLine
	if json.Unmarshal(line, &m) != nil || m.Method != "" || len(m.ID) == 0 {
		return // a notification or a request of the server's own
	}
	f.mu.Lock()
	if f.ids[string(m.ID)] {
		delete(f.ids, string(m.ID))
		close(f.changed)
		f.changed = make(chan struct{})
	}
	f.mu.Unlock()
}

// wait returns once every request read was answered, or after drainTimeout.
func (f *inflight) wait() {
	deadline := time.After(drainTimeout)
	for {
		f.mu.Lock()
		n, changed := len(f.ids), f.changed
		f.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			return
		}
	}
}

// MaxLine bounds one message on stdin: a request with MaxStdin of stdin text, escaped, and
// room for the rest. A longer line is refused while it is read, never held whole.
const MaxLine = 2*MaxStdin + 1<<20

// drainReader passes stdin through line by line, noting requests, refusing lines longer than
// MaxLine (answered on refuse with a JSON-RPC error, for the id when it leads the line), and
// holds back its end.
type drainReader struct {
	r      *bufio.Reader
	f      *inflight
	refuse io.Writer
	rest   []byte
}

func (d *drainReader) Read(p []byte) (int, error) {
	for len(d.rest) == 0 {
		line, err := d.readLine()
		if len(line) > 0 {
			d.f.read(bytes.TrimSpace(line))
			d.rest = line
		} else if err != nil {
			if err == io.EOF {
				d.f.wait()
			}
			return 0, err
		}
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

// readLine returns the next line of at most MaxLine bytes; a longer one is skipped to its end
// and refused, and nil returned for it.
func (d *drainReader) readLine() ([]byte, error) {
	const limit = MaxLine
	var line []byte
	for {
		chunk, err := d.r.ReadSlice('\n')
		if len(line)+len(chunk) > limit {
			head := line
			if len(head) < 64<<10 {
				head = append(head, chunk[:min(len(chunk), 64<<10-len(head))]...)
			}
			for err == bufio.ErrBufferFull {
				_, err = d.r.ReadSlice('\n')
			}
			d.refuseLine(head, limit)
			return nil, err
		}
		if cap(line)-len(line) < len(chunk) {
			// Double (append grows large slices by a quarter: five times the line in garbage).
			grown := make([]byte, len(line), min(max(2*cap(line), 64<<10), limit+1))
			copy(grown, line)
			line = grown
		}
		line = append(line, chunk...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
	}
}

// refuseLine answers an over-long line: "invalid request" for the id it starts with, if any.
func (d *drainReader) refuseLine(head []byte, limit int) {
	id := json.RawMessage("null")
	if v := leadingID(head); v != nil {
		id = v
	}
	resp, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{
		"code": -32600, "message": fmt.Sprintf("request refused: a message line is longer than %d bytes", limit)}})
	d.refuse.Write(append(resp, '\n'))
}

// leadingID is the "id" of the JSON object head begins with, when it comes before any member
// that head cuts off.
func leadingID(head []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(head))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
		if t == "id" {
			if len(v) > 0 && (v[0] == '"' || v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
				return v
			}
			return nil
		}
	}
	return nil
}

// answerWriter passes stdout through and notes each answer as its line completes.
type answerWriter struct {
	mu  sync.Mutex
	w   io.Writer
	f   *inflight
	buf []byte
}

func (a *answerWriter) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, err := a.w.Write(p)
	a.buf = append(a.buf, p[:n]...)
	for {
		i := bytes.IndexByte(a.buf, '\n')
		if i < 0 {
			break
		}
		a.f.written(a.buf[:i])
		a.buf = a.buf[i+1:]
	}
	return n, err
}
