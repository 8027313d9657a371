package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// maxQMPLine bounds one QMP message. QEMU's replies to the commands we send are far smaller.
const maxQMPLine = 1 << 20

// ErrQMPClosed is returned by Execute once the connection has ended.
var ErrQMPClosed = errors.New("qmp: connection closed")

// Event is an asynchronous QMP event such as STOP, RESUME or SHUTDOWN.
type Event struct {
	Name string
	Data json.RawMessage
	Time time.Time
}

// QMPError is an error reply from QEMU.
type QMPError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *QMPError) Error() string { return e.Class + ": " + e.Desc }

// message is any line QEMU sends: greeting, reply or event.
type message struct {
	QMP       json.RawMessage `json:"QMP,omitempty"`
	Return    json.RawMessage `json:"return,omitempty"`
	Error     *QMPError       `json:"error,omitempty"`
	Event     string          `json:"event,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
	ID        json.RawMessage `json:"id,omitempty"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp,omitempty"`
}

// decodeMessage parses one QMP line and checks it is one of the three kinds of message.
func decodeMessage(line []byte) (*message, error) {
	if len(line) > maxQMPLine {
		return nil, errors.New("qmp: message too long")
	}
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		return nil, fmt.Errorf("qmp: bad message: %w", err)
	}
	kinds := 0
	if m.QMP != nil {
		kinds++
	}
	if m.Return != nil || m.Error != nil {
		kinds++
	}
	if m.Event != "" {
		kinds++
	}
	if kinds != 1 {
		return nil, errors.New("qmp: message is not exactly one of greeting, reply, event")
	}
	if len(m.Event) > 128 {
		return nil, errors.New("qmp: event name too long")
	}
	return &m, nil
}

// QMP is a client for QEMU's machine protocol on a unix socket. Execute may be called from
// several goroutines; events go to a bounded channel and the oldest are dropped when nobody reads.
type QMP struct {
	conn    net.Conn
	wmu     sync.Mutex
	nextID  atomic.Uint64
	mu      sync.Mutex
	pending map[string]chan *message
	events  chan Event
	done    chan struct{}
	err     error // why the reader stopped; set before done is closed

	ioMu     sync.Mutex
	ioErrors hypervisor.DiskErrors // BLOCK_IO_ERROR events seen on this connection
}

// blockIOError is the data of QEMU's BLOCK_IO_ERROR event.
type blockIOError struct {
	Device    string `json:"device"`
	NodeName  string `json:"node-name"`
	Operation string `json:"operation"`
	Action    string `json:"action"`
	NoSpace   bool   `json:"nospace"`
	Reason    string `json:"reason"`
}

// recordIOError counts a BLOCK_IO_ERROR: with werror=report,rerror=report QEMU hands the error
// to the guest (ENOSPC, EIO) and keeps running; the count tells the vmm why a guest struggles.
func (q *QMP) recordIOError(data json.RawMessage, at time.Time) {
	var e blockIOError
	if json.Unmarshal(data, &e) != nil {
		return
	}
	q.ioMu.Lock()
	defer q.ioMu.Unlock()
	q.ioErrors.Count++
	if e.NoSpace {
		q.ioErrors.NoSpace++
	}
	dev := e.NodeName
	if dev == "" {
		dev = e.Device
	}
	q.ioErrors.Last = truncate([]byte(fmt.Sprintf("%s %s: %s", dev, e.Operation, e.Reason)), 200)
	q.ioErrors.LastAt = at
}

// DiskErrors is what BLOCK_IO_ERROR events said since the connection was made.
func (q *QMP) DiskErrors() hypervisor.DiskErrors {
	q.ioMu.Lock()
	defer q.ioMu.Unlock()
	return q.ioErrors
}

// DialQMP connects to a QMP socket, reads the greeting and negotiates capabilities.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial: %w", err)
	}
	q := &QMP{
		conn:    conn,
		pending: map[string]chan *message{},
		events:  make(chan Event, 64),
		done:    make(chan struct{}),
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	} else {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	}
	line, err := readLine(r)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("qmp: greeting: %w", err)
	}
	m, err := decodeMessage(line)
	if err != nil || m.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("qmp: greeting: unexpected %q", truncate(line, 120))
	}
	conn.SetReadDeadline(time.Time{})
	go q.readLoop(r)
	if _, err := q.Execute(ctx, "qmp_capabilities", nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// readLine reads one newline-terminated line of at most maxQMPLine bytes.
func readLine(r *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(buf)+len(chunk) > maxQMPLine {
			return nil, errors.New("qmp: message too long")
		}
		buf = append(buf, chunk...)
		if err == nil {
			return buf, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

func (q *QMP) readLoop(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = readLine(r)
		if err != nil {
			break
		}
		m, derr := decodeMessage(line)
		if derr != nil {
			err = derr
			break
		}
		switch {
		case m.Event != "":
			ev := Event{Name: m.Event, Data: m.Data}
			if m.Timestamp != nil {
				ev.Time = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
			}
			if ev.Name == "BLOCK_IO_ERROR" {
				q.recordIOError(ev.Data, ev.Time)
			}
			q.pushEvent(ev)
		case m.Return != nil || m.Error != nil:
			var id string
			if json.Unmarshal(m.ID, &id) != nil {
				continue // a reply we did not ask for
			}
			q.mu.Lock()
			ch := q.pending[id]
			delete(q.pending, id)
			q.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		}
	}
	q.mu.Lock()
	q.err = err
	q.mu.Unlock()
	close(q.done)
	q.conn.Close()
	close(q.events)
}

func (q *QMP) pushEvent(ev Event) {
	for {
		select {
		case q.events <- ev:
			return
		default:
		}
		select { // full: drop the oldest
		case <-q.events:
		default:
		}
	}
}

// Events returns the event channel; it is closed when the connection ends.
func (q *QMP) Events() <-chan Event { return q.events }

// PortOpened reads events until ctx ends and signals each time the guest opens a virtio-serial
// port (VSERPORT_CHANGE with open true). The VM has one port, the agent's.
func (q *QMP) PortOpened(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-q.events:
				if !ok {
					return
				}
				var d struct {
					Open bool `json:"open"`
				}
				if ev.Name == "VSERPORT_CHANGE" && json.Unmarshal(ev.Data, &d) == nil && d.Open {
					select {
					case out <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	return out
}

// Execute runs one command and returns its "return" value. args may be nil.
func (q *QMP) Execute(ctx context.Context, command string, args any) (json.RawMessage, error) {
	return q.execute(ctx, command, args, -1)
}

// SendFD passes fd to QEMU under name (QMP getfd), for a later "fd:<name>" migration URI: QEMU's
// seccomp filter forbids the "exec:" URIs, which spawn a process.
func (q *QMP) SendFD(ctx context.Context, name string, fd int) error {
	_, err := q.execute(ctx, "getfd", map[string]any{"fdname": name}, fd)
	return err
}

func (q *QMP) execute(ctx context.Context, command string, args any, fd int) (json.RawMessage, error) {
	id := strconv.FormatUint(q.nextID.Add(1), 10)
	req := map[string]any{"execute": command, "id": id}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	ch := make(chan *message, 1)
	q.mu.Lock()
	select {
	case <-q.done:
		q.mu.Unlock()
		return nil, fmt.Errorf("qmp %s: %w", command, ErrQMPClosed)
	default:
	}
	q.pending[id] = ch
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		delete(q.pending, id)
		q.mu.Unlock()
	}()

	q.wmu.Lock()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(10 * time.Second)
	}
	q.conn.SetWriteDeadline(dl)
	if uc, ok := q.conn.(*net.UnixConn); ok && fd >= 0 {
		_, _, err = uc.WriteMsgUnix(append(b, '\n'), unix.UnixRights(fd), nil)
	} else if fd >= 0 {
		err = errors.New("qmp: passing a file needs a unix socket")
	} else {
		_, err = q.conn.Write(append(b, '\n'))
	}
	q.wmu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			return nil, fmt.Errorf("qmp %s: %w", command, m.Error)
		}
		return m.Return, nil
	case <-q.done:
		return nil, fmt.Errorf("qmp %s: %w", command, ErrQMPClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("qmp %s: %w", command, ctx.Err())
	}
}

// Close ends the connection; QEMU keeps running.
func (q *QMP) Close() error {
	err := q.conn.Close()
	<-q.done
	return err
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
