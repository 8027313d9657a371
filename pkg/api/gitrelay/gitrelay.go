// Package gitrelay is the contract between the guest's ssh shim (`nexus-agent ssh-shim`, the
// guest's GIT_SSH_COMMAND) and the host's git relay service (services/gitrelay).
//
// The shim reaches the relay through the agent's host-dial socket on guest-visible host port
// GuestPort; on the host the connection arrives on the sandbox's hybrid-vsock socket
// $NEXUS_HOME/sandboxes/<id>/vsock.sock_<GuestPort>, where the relay listens.
//
// Over that one byte stream both sides exchange frames: a one-byte type, a four-byte big-endian
// payload length (at most MaxFrame), the payload. The shim sends FrameHello first (a JSON
// Hello: the argv git gave ssh), then FrameStdin frames and one FrameStdinEOF; the relay sends
// FrameStdout and FrameStderr frames and ends with one FrameExit (a 4-byte big-endian exit code).
// Nothing in this package depends on more than the standard library: the guest agent links it.
package gitrelay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// GuestPort is the host port a guest dials (nexus-agent dial-host) to reach the relay.
const GuestPort = 2222

// SocketName is the hybrid-vsock socket the relay listens on in a sandbox's directory.
var SocketName = "vsock.sock_" + strconv.Itoa(GuestPort)

// Frame types.
const (
	FrameHello    byte = 'H' // guest → host: JSON Hello, first and once
	FrameStdin    byte = 'I' // guest → host: bytes for the remote command's stdin
	FrameStdinEOF byte = 'i' // guest → host: stdin ended (empty payload)
	FrameStdout   byte = 'O' // host → guest: the remote command's stdout
	FrameStderr   byte = 'E' // host → guest: ssh's and the relay's stderr
	FrameExit     byte = 'X' // host → guest: 4-byte big-endian exit code, last frame
)

// MaxFrame bounds a frame's payload; MaxHello bounds the hello frame.
const (
	MaxFrame = 64 << 10
	MaxHello = 16 << 10
)

// Hello is what the shim sends first: the ssh argv (without the program name) and the
// GIT_PROTOCOL git asked ssh to send (`-o SendEnv=GIT_PROTOCOL`), if any.
type Hello struct {
	Args        []string `json:"args"`
	GitProtocol string   `json:"git_protocol,omitempty"`
}

// ErrFrame wraps every framing error.
var ErrFrame = errors.New("gitrelay: bad frame")

// WriteFrame writes one frame. A payload over MaxFrame is an error; callers split.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("%w: payload of %d bytes", ErrFrame, len(payload))
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) == 0 {
		_, err := w.Write(hdr[:])
		return err
	}
	// One write per frame keeps frames whole when several goroutines share w behind a mutex.
	buf := make([]byte, 0, len(hdr)+len(payload))
	buf = append(append(buf, hdr[:]...), payload...)
	_, err := w.Write(buf)
	return err
}

// ExitPayload encodes an exit code for FrameExit.
func ExitPayload(code int) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(int32(code)))
}

// ParseExit decodes a FrameExit payload.
func ParseExit(p []byte) (int, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%w: exit payload of %d bytes", ErrFrame, len(p))
	}
	return int(int32(binary.BigEndian.Uint32(p))), nil
}

// FrameReader reads frames into a buffer it reuses.
type FrameReader struct {
	r   io.Reader
	buf []byte
	hdr [5]byte
}

// NewFrameReader reads frames from r.
func NewFrameReader(r io.Reader) *FrameReader { return &FrameReader{r: r} }

// Next returns the next frame; its payload is valid until the following call. A clean end of
// input before a frame is io.EOF; a frame cut short is io.ErrUnexpectedEOF.
func (f *FrameReader) Next(max int) (byte, []byte, error) {
	if _, err := io.ReadFull(f.r, f.hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(f.hdr[1:])
	if max <= 0 || max > MaxFrame {
		max = MaxFrame
	}
	if n > uint32(max) {
		return 0, nil, fmt.Errorf("%w: %d-byte payload is over %d", ErrFrame, n, max)
	}
	if cap(f.buf) < int(n) {
		f.buf = make([]byte, n)
	}
	f.buf = f.buf[:n]
	if _, err := io.ReadFull(f.r, f.buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return f.hdr[0], f.buf, nil
}

// CopyFrames reads r until EOF and writes what it reads as frames of type typ (up to MaxFrame
// each, header and payload in one write, no allocation per frame). It returns the payload bytes
// written; io.EOF from r is not an error.
func CopyFrames(w io.Writer, typ byte, r io.Reader) (int64, error) {
	buf := make([]byte, 5+MaxFrame)
	var n int64
	for {
		k, err := r.Read(buf[5:])
		if k > 0 {
			buf[0] = typ
			binary.BigEndian.PutUint32(buf[1:5], uint32(k))
			if _, werr := w.Write(buf[:5+k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// FrameWriter is an io.Writer that wraps each Write in frames of one type.
type FrameWriter struct {
	W   io.Writer
	Typ byte
}

func (fw FrameWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), MaxFrame)
		if err := WriteFrame(fw.W, fw.Typ, p[:c]); err != nil {
			return n, err
		}
		n += c
		p = p[c:]
	}
	return n, nil
}
