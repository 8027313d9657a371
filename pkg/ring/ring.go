// Package ring is a fixed-size byte ring that keeps the last bytes written to it.
package ring

import "sync"

// Ring keeps the last bytes written to it, up to its size (the guest agent's own log; the tail
// of a long command output the MCP server keeps).
type Ring struct {
	mu    sync.Mutex
	buf   []byte // grows to cap, then wraps
	start int    // index of the oldest byte once full
}

// New returns a Ring of size bytes.
func New(size int) *Ring { return &Ring{buf: make([]byte, 0, size)} }

// Write appends p, dropping the oldest bytes beyond the ring's size. It never fails.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	size := cap(r.buf)
	if size == 0 {
		return n, nil
	}
	if len(p) > size {
		p = p[len(p)-size:]
	}
	if room := size - len(r.buf); room > 0 {
		c := min(room, len(p))
		r.buf = append(r.buf, p[:c]...)
		p = p[c:]
	}
	for len(p) > 0 {
		c := copy(r.buf[r.start:], p)
		p = p[c:]
		r.start = (r.start + c) % size
	}
	return n, nil
}

// Bytes returns a copy of the ring's content, oldest first.
func (r *Ring) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]byte, 0, len(r.buf))
	out = append(out, r.buf[r.start:]...)
	return append(out, r.buf[:r.start]...)
}
