package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The spool is a publisher's write-ahead file: every event is appended before it is published
// and marked once JetStream acknowledged it. A publisher started on the same file (the service
// restarted after a crash, or while the bus was down) republishes what was never acknowledged,
// with the original message ids, so the stream's duplicate window drops what did land.

const (
	// maxSpoolLine bounds one record read back.
	maxSpoolLine = 1 << 20
	// spoolCompactBytes: once everything written is acknowledged, a file past this size starts
	// over empty.
	spoolCompactBytes = 4 << 20
)

// spoolRecord is one line: an event (ID, Subject, Data) or the acknowledgement of one (Ack).
type spoolRecord struct {
	ID      string          `json:"id,omitempty"`
	Subject string          `json:"subject,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	Ack     string          `json:"ack,omitempty"`
}

type spool struct {
	mu      sync.Mutex
	f       *os.File
	w       *bufio.Writer
	size    int64
	pending int // events written and not yet acknowledged
}

// openSpool locks path (one publisher per file), reads back what was never acknowledged, and
// rewrites the file to hold just that. An event an older build spooled on the legacy
// nexus.audit.egress.<sandbox> is moved under service's own subject, where it may publish.
func openSpool(path, service string) (*spool, []pubItem, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, nil, fmt.Errorf("audit spool: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("audit spool: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("audit spool %s: in use by another process", path)
	}
	left, err := readSpool(f)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	legacy := Prefix + "." + LegacyService + "."
	for i := range left {
		if id, ok := strings.CutPrefix(left[i].subject, legacy); ok {
			left[i].subject = Subject(service, id)
		}
	}
	s := &spool{f: f}
	if err := s.reset(left); err != nil {
		f.Close()
		return nil, nil, err
	}
	return s, left, nil
}

// readSpool returns the events without an acknowledgement, in the order written. A torn last
// line (the process died mid-write) is skipped.
func readSpool(r io.Reader) ([]pubItem, error) {
	var order []string
	items := map[string]pubItem{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxSpoolLine)
	for sc.Scan() {
		var rec spoolRecord
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		switch {
		case rec.Ack != "":
			delete(items, rec.Ack)
		case rec.ID != "" && rec.Subject != "" && len(rec.Data) > 0:
			if _, seen := items[rec.ID]; !seen {
				order = append(order, rec.ID)
			}
			items[rec.ID] = pubItem{subject: rec.Subject, id: rec.ID, data: rec.Data}
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("audit spool: %w", err)
	}
	var left []pubItem
	for _, id := range order {
		if it, ok := items[id]; ok {
			left = append(left, it)
		}
	}
	return left, nil
}

// reset empties the file and writes items back as pending events.
func (s *spool) reset(items []pubItem) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.f.Truncate(0); err != nil {
		return fmt.Errorf("audit spool: %w", err)
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("audit spool: %w", err)
	}
	s.w = bufio.NewWriterSize(s.f, 64<<10)
	s.size, s.pending = 0, 0
	s.writeEvents(items)
	return s.flushLocked()
}

// append writes events before they are published; the write reaches the kernel before it
// returns, so a crash of the process loses none of them.
func (s *spool) append(items []pubItem) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writeEvents(items)
	return s.flushLocked()
}

func (s *spool) writeEvents(items []pubItem) {
	for _, it := range items {
		b, _ := json.Marshal(spoolRecord{ID: it.id, Subject: it.subject, Data: it.data})
		n, _ := s.w.Write(append(b, '\n'))
		s.size += int64(n)
		s.pending++
	}
}

// ack marks an event acknowledged (buffered: flushed with the next events, by flush, or on close;
// an acknowledgement lost in a crash only makes the event be sent again, which the stream's
// duplicate window drops).
func (s *spool) ack(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := json.Marshal(spoolRecord{Ack: id})
	n, _ := s.w.Write(append(b, '\n'))
	s.size += int64(n)
	s.pending--
	if s.pending == 0 && s.size > spoolCompactBytes {
		s.w.Reset(s.f)
		if s.f.Truncate(0) == nil {
			s.f.Seek(0, io.SeekStart)
			s.size = 0
		}
	}
}

func (s *spool) flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushLocked()
}

func (s *spool) flushLocked() error {
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("audit spool: %w", err)
	}
	return nil
}

func (s *spool) close() error {
	err := s.flush()
	return errors.Join(err, s.f.Close())
}
