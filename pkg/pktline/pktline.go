// Package pktline reads git's pkt-line framing (gitprotocol-common) and the ref-update commands
// a client sends to git-receive-pack, so that a push can be judged before it reaches the remote.
// The smart-HTTP policy of the mitm and the git SSH relay both use it.
//
// Everything read here comes from an untrusted guest: lines are bounded by the format (65520
// bytes), the command section by Limits, and every error is one line that never echoes the
// guest's bytes beyond a validated ref name.
package pktline

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// MaxPayload is the largest payload a pkt-line may carry (65520 bytes of line minus the 4-byte
// length).
const MaxPayload = 65516

// Kind is the type of a packet.
type Kind int

const (
	Data        Kind = iota // a data line
	Flush                   // 0000
	Delim                   // 0001 (protocol v2)
	ResponseEnd             // 0002 (protocol v2)
)

// Packet is one pkt-line.
type Packet struct {
	Kind    Kind
	Payload []byte // Data only; valid until the next call to Next
}

// ErrMalformed wraps every framing error.
var ErrMalformed = errors.New("pktline: malformed")

// Reader reads packets from an underlying reader, never past the end of the last packet it
// returned.
type Reader struct {
	r   io.Reader
	buf []byte
	hdr [4]byte
}

// NewReader reads pkt-lines from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// Next returns the next packet. At a clean end of input before a packet it returns io.EOF; a
// packet cut short is io.ErrUnexpectedEOF.
func (p *Reader) Next() (Packet, error) {
	if _, err := io.ReadFull(p.r, p.hdr[:]); err != nil {
		return Packet{}, err
	}
	n, ok := parseLen(p.hdr)
	if !ok {
		return Packet{}, fmt.Errorf("%w: bad length header", ErrMalformed)
	}
	switch n {
	case 0:
		return Packet{Kind: Flush}, nil
	case 1:
		return Packet{Kind: Delim}, nil
	case 2:
		return Packet{Kind: ResponseEnd}, nil
	case 3:
		return Packet{}, fmt.Errorf("%w: length 3 is reserved", ErrMalformed)
	}
	n -= 4
	if n > MaxPayload {
		return Packet{}, fmt.Errorf("%w: line longer than %d bytes", ErrMalformed, MaxPayload)
	}
	if cap(p.buf) < n {
		p.buf = make([]byte, n)
	}
	p.buf = p.buf[:n]
	if _, err := io.ReadFull(p.r, p.buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Packet{}, err
	}
	return Packet{Kind: Data, Payload: p.buf}, nil
}

func parseLen(h [4]byte) (int, bool) {
	n := 0
	for _, c := range h {
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		n = n<<4 | int(v)
	}
	return n, true
}

// AppendData appends payload framed as a data pkt-line (payload must be at most MaxPayload).
func AppendData(dst, payload []byte) []byte {
	return append(append(dst, fmt.Sprintf("%04x", len(payload)+4)...), payload...)
}

// AppendFlush appends a flush packet.
func AppendFlush(dst []byte) []byte { return append(dst, "0000"...) }

// trimLF drops one trailing newline, which pkt-line payloads may or may not carry.
func trimLF(b []byte) []byte { return bytes.TrimSuffix(b, []byte{'\n'}) }
