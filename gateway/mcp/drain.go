package mcp

import (
	"bufio"
	"bytes"
	"encoding/json"
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

// drainReader passes stdin through line by line, noting requests, and holds back its end.
type drainReader struct {
	r    *bufio.Reader
	f    *inflight
	rest []byte
}

func (d *drainReader) Read(p []byte) (int, error) {
	if len(d.rest) == 0 {
		line, err := d.r.ReadBytes('\n')
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
