package http1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http/httputil"
	"sync"
)

// Framing is how a message delimits its body on the wire: by its length, chunked, or (a body
// relayed to an HTTP/1.0 peer) by closing the connection; none of these for no body.
type Framing struct {
	Length  int64 // >= 0: this many bytes; -1: not by length
	Chunked bool
	Close   bool
}

// NoBody is the framing of a message without a body.
var NoBody = Framing{Length: -1}

// framing reads the framing fields of a head (RFC 9112 §6): Transfer-Encoding, which must be
// "chunked" alone, wins over Content-Length; several lengths must agree.
func (h *Head) framing(http10 bool) (Framing, error) {
	f := NoBody
	te := 0
	var err error
	for _, fl := range h.Fields {
		switch {
		case fl.Is("Transfer-Encoding"):
			te++
			if te > 1 || !asciiEqualFold(fl.Value, "chunked") {
				return f, &Error{Reason: "unsupported transfer coding", Value: bytes.Clone(fl.Value)}
			}
			f.Chunked = true
		case fl.Is("Content-Length"):
			n, perr := parseLength(fl.Value)
			if perr != nil || (f.Length >= 0 && n != f.Length) {
				err = malformed("invalid Content-Length")
			}
			f.Length = n
		}
	}
	if f.Chunked {
		if http10 {
			return f, malformed("chunked body in an HTTP/1.0 message")
		}
		return Framing{Length: -1, Chunked: true}, nil
	}
	return f, err
}

// body is the reader of a body framed by f from br: chunked (its trailer read at the end, at
// most limit bytes) or of f.Length bytes; nil when the length is zero.
func (f Framing) body(br *bufio.Reader, limit int) (io.Reader, *ChunkedBody) {
	switch {
	case f.Chunked:
		c := &ChunkedBody{r: br, cr: httputil.NewChunkedReader(br), limit: limit}
		return c, c
	case f.Length > 0:
		return &lengthBody{r: br, left: f.Length}, nil
	}
	return nil, nil
}

func parseLength(v []byte) (int64, error) {
	if len(v) == 0 || len(v) > 18 {
		return 0, errors.New("bad length")
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, errors.New("bad length")
		}
		n = n*10 + int64(c-'0')
	}
	return n, nil
}

// lengthBody is a body of a known length: a peer that stops early is an error, never a short body.
type lengthBody struct {
	r    *bufio.Reader
	left int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if errors.Is(err, io.EOF) {
		if b.left > 0 {
			return n, io.ErrUnexpectedEOF
		}
		err = nil
	}
	return n, err
}

// ChunkedBody decodes a chunked body and then reads its trailer fields into Trailer.
type ChunkedBody struct {
	// Trailer holds the trailer fields once the body has been read to its end.
	Trailer Head
	// Check, when set, judges the trailer fields before the body is reported whole: its error
	// is the body's.
	Check func(*Head) error

	r     *bufio.Reader
	cr    io.Reader
	limit int
	done  bool
}

func (b *ChunkedBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.cr.Read(p)
	if errors.Is(err, io.EOF) {
		if terr := b.readTrailer(); terr != nil {
			return n, terr
		}
		if b.Check != nil {
			if cerr := b.Check(&b.Trailer); cerr != nil {
				return n, cerr
			}
		}
		b.done = true
	}
	return n, err
}

// readTrailer reads the fields after the last chunk, up to the empty line.
func (b *ChunkedBody) readTrailer() error {
	t := &b.Trailer
	t.buf, t.Fields = t.buf[:0], t.Fields[:0]
	for {
		line, err := b.r.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		if !bytes.HasSuffix(line, []byte("\r\n")) {
			// net/http does not take bare LF line ends after the last chunk: neither does
			// this reader, so both ends agree where a body ends.
			return malformed("bare LF after the last chunk")
		}
		line = line[:len(line)-2]
		if len(line) == 0 {
			return nil
		}
		if len(t.buf)+len(line) > b.limit || len(t.Fields) >= MaxFields {
			return ErrHeadTooLarge
		}
		// Copy: the reader's buffer is reused by the next read. Fields already parsed keep
		// pointing into the old array if append moves buf; nothing writes to that again.
		off := len(t.buf)
		t.buf = append(t.buf, line...)
		f, err := parseField(t.buf[off:])
		if err != nil {
			return err
		}
		t.Fields = append(t.Fields, f)
	}
}

// CopyBody writes body framed by f and flushes it: chunked, each chunk flushed to the peer as it
// arrives and then the trailer fields of src (the chunked body it was read as; nil for none),
// else as it comes. A body framed by its length must have that length.
func CopyBody(bw *bufio.Writer, body io.Reader, f Framing, src *ChunkedBody) (int64, error) {
	buf := copyBufferPool.Get().(*[]byte)
	defer copyBufferPool.Put(buf)
	if f.Chunked {
		var trailer *Head
		if src != nil {
			trailer = &src.Trailer
		}
		return copyChunked(bw, body, trailer, *buf)
	}
	n, err := io.CopyBuffer(bw, onlyReader{body}, *buf)
	if err == nil && f.Length >= 0 && n != f.Length {
		err = fmt.Errorf("body of %d bytes, %d declared", n, f.Length)
	}
	if err == nil {
		err = bw.Flush()
	}
	return n, err
}

func copyChunked(bw *bufio.Writer, body io.Reader, trailer *Head, buf []byte) (int64, error) {
	cw := httputil.NewChunkedWriter(bw)
	var n int64
	for {
		k, rerr := body.Read(buf)
		if k > 0 {
			if _, err := cw.Write(buf[:k]); err != nil {
				return n, err
			}
			n += int64(k)
			if err := bw.Flush(); err != nil {
				return n, err
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return n, rerr
		}
	}
	if err := cw.Close(); err != nil {
		return n, err
	}
	if trailer != nil {
		for _, f := range trailer.Fields {
			if len(f.Value) > 0 {
				writeFieldBytes(bw, f.Name, f.Value)
			}
		}
	}
	bw.WriteString("\r\n")
	return n, bw.Flush()
}

// onlyReader hides a body's WriterTo so io.CopyBuffer uses the pooled buffer.
type onlyReader struct{ io.Reader }

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
