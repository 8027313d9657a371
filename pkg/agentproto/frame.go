package agentproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// MaxFramePayload bounds one frame's payload.
const MaxFramePayload = 64 << 10

// FrameHeaderLen is the size of a frame header: type byte + big-endian uint32 length.
const FrameHeaderLen = 5

// FrameType is the first byte of a frame.
type FrameType byte

const (
	FrameStdin      FrameType = 1 // host→agent: bytes for the process stdin
	FrameStdinClose FrameType = 2 // host→agent: close the process stdin (empty payload)
	FrameStdout     FrameType = 3 // agent→host
	FrameStderr     FrameType = 4 // agent→host
	FrameResize     FrameType = 5 // host→agent: rows uint16, cols uint16
	FrameSignal     FrameType = 6 // host→agent: signal number uint32
	FrameExit       FrameType = 7 // agent→host, last frame of exec: code int32, signal uint32
	FrameError      FrameType = 8 // agent→host: a one-line message
	FrameData       FrameType = 9 // copy-in, copy-out, logs content
	FrameEnd        FrameType = 10
)

func (t FrameType) String() string {
	switch t {
	case FrameStdin:
		return "stdin"
	case FrameStdinClose:
		return "stdin-close"
	case FrameStdout:
		return "stdout"
	case FrameStderr:
		return "stderr"
	case FrameResize:
		return "resize"
	case FrameSignal:
		return "signal"
	case FrameExit:
		return "exit"
	case FrameError:
		return "error"
	case FrameData:
		return "data"
	case FrameEnd:
		return "end"
	}
	return fmt.Sprintf("frame(%d)", byte(t))
}

// ErrFrameTooLarge is returned for a frame longer than MaxFramePayload (or the reader's buffer).
var ErrFrameTooLarge = errors.New("frame exceeds the size limit")

// ErrBadFrame is returned for an unknown type or a payload of the wrong size for its type.
var ErrBadFrame = errors.New("malformed frame")

// fixedLen is the exact payload length of fixed-size frame types (-1: any length).
func fixedLen(t FrameType) int {
	switch t {
	case FrameStdinClose, FrameEnd:
		return 0
	case FrameResize, FrameSignal:
		return 4
	case FrameExit:
		return 8
	case FrameStdin, FrameStdout, FrameStderr, FrameError, FrameData:
		return -1
	}
	return -2
}

// ReadFrame reads one frame into buf and returns its type and payload (a slice of buf, valid until
// buf is reused). A frame longer than len(buf) or MaxFramePayload is refused before any of its
// payload is read; an unknown type or a wrong fixed size is ErrBadFrame. Use a buffer of
// MaxFramePayload bytes to accept every valid frame.
func ReadFrame(r io.Reader, buf []byte) (FrameType, []byte, error) {
	var hdr [FrameHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	t := FrameType(hdr[0])
	n := binary.BigEndian.Uint32(hdr[1:])
	want := fixedLen(t)
	switch {
	case want == -2:
		return 0, nil, fmt.Errorf("read frame: type %d: %w", hdr[0], ErrBadFrame)
	case want >= 0 && int64(n) != int64(want):
		return 0, nil, fmt.Errorf("read frame: %s with %d bytes: %w", t, n, ErrBadFrame)
	case n > MaxFramePayload || int64(n) > int64(len(buf)):
		return 0, nil, fmt.Errorf("read frame: %s of %d bytes: %w", t, n, ErrFrameTooLarge)
	}
	p := buf[:n]
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, fmt.Errorf("read frame: %w", noEOF(err))
	}
	return t, p, nil
}

// FrameWriter writes whole frames to w; it is safe for concurrent use and each frame is one
// Write call on w (so frames from concurrent writers never interleave).
type FrameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

// NewFrameWriter returns a FrameWriter on w.
func NewFrameWriter(w io.Writer) *FrameWriter { return &FrameWriter{w: w} }

// WriteFrame writes one frame; payloads above MaxFramePayload are refused.
func (fw *FrameWriter) WriteFrame(t FrameType, payload []byte) error {
	if len(payload) > MaxFramePayload {
		return fmt.Errorf("write frame: %s of %d bytes: %w", t, len(payload), ErrFrameTooLarge)
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	need := FrameHeaderLen + len(payload)
	if cap(fw.buf) < need {
		fw.buf = make([]byte, need)
	}
	b := fw.buf[:need]
	b[0] = byte(t)
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	copy(b[FrameHeaderLen:], payload)
	_, err := fw.w.Write(b)
	return err
}

// WriteHeaded writes a frame that the caller already laid out in b: b[FrameHeaderLen:] is the
// payload and the header bytes are filled in here. It saves a copy on the streaming hot path.
func (fw *FrameWriter) WriteHeaded(t FrameType, b []byte) error {
	n := len(b) - FrameHeaderLen
	if n < 0 || n > MaxFramePayload {
		return fmt.Errorf("write frame: %s of %d bytes: %w", t, n, ErrFrameTooLarge)
	}
	b[0] = byte(t)
	binary.BigEndian.PutUint32(b[1:], uint32(n))
	fw.mu.Lock()
	defer fw.mu.Unlock()
	_, err := fw.w.Write(b)
	return err
}

// Resize payload helpers.

// EncodeResize is the payload of a FrameResize.
func EncodeResize(rows, cols uint16) []byte {
	var b [4]byte
	binary.BigEndian.PutUint16(b[0:], rows)
	binary.BigEndian.PutUint16(b[2:], cols)
	return b[:]
}

// DecodeResize reads a FrameResize payload (exactly 4 bytes, checked by ReadFrame).
func DecodeResize(p []byte) (rows, cols uint16) {
	return binary.BigEndian.Uint16(p[0:]), binary.BigEndian.Uint16(p[2:])
}

// EncodeSignal is the payload of a FrameSignal.
func EncodeSignal(sig uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], sig)
	return b[:]
}

// DecodeSignal reads a FrameSignal payload.
func DecodeSignal(p []byte) uint32 { return binary.BigEndian.Uint32(p) }

// EncodeExit is the payload of a FrameExit: the exit code (128+signal after a signal death) and
// the signal that killed the process (0 when it exited).
func EncodeExit(code int32, signal uint32) []byte {
	var b [8]byte
	binary.BigEndian.PutUint32(b[0:], uint32(code))
	binary.BigEndian.PutUint32(b[4:], signal)
	return b[:]
}

// DecodeExit reads a FrameExit payload.
func DecodeExit(p []byte) (code int32, signal uint32) {
	return int32(binary.BigEndian.Uint32(p[0:])), binary.BigEndian.Uint32(p[4:])
}
