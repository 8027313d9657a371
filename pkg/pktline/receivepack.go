package pktline

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Limits bound what ReadUpdateRequest buffers.
type Limits struct {
	// MaxBytes bounds the command section (default 1 MiB).
	MaxBytes int
	// MaxCommands bounds the number of ref updates (default 4096).
	MaxCommands int
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = 1 << 20
	}
	if l.MaxCommands <= 0 {
		l.MaxCommands = 4096
	}
	return l
}

// Command is one ref update of a push.
type Command struct {
	Old string `json:"old"` // object id the ref has now (all zeros: create)
	New string `json:"new"` // object id it should get (all zeros: delete)
	Ref string `json:"ref"`
}

// Delete reports whether the command deletes its ref.
func (c Command) Delete() bool { return strings.Trim(c.New, "0") == "" }

// UpdateRequest is the command section of a git-receive-pack request: what a push asks the
// remote to change. The push options and the pack that follow it are not read.
type UpdateRequest struct {
	Shallow      []string  `json:"shallow,omitempty"`
	Commands     []Command `json:"commands"`
	Capabilities []string  `json:"capabilities,omitempty"`
}

// Errors of ReadUpdateRequest besides ErrMalformed.
var (
	ErrTooLarge   = errors.New("pktline: push command section is too large")
	ErrSignedPush = errors.New("pktline: signed pushes (push-cert) are not supported")
)

// ReadUpdateRequest reads a receive-pack request's shallow lines and ref-update commands from r,
// up to and including the flush that ends them, and returns them together with exactly the bytes
// it consumed, so a proxy can forward those bytes and then stream the rest of r (push options and
// the pack) untouched. On an error the bytes are those consumed before it.
//
// Only bytes of the command section are read; a section larger than lim.MaxBytes or with more
// than lim.MaxCommands commands is ErrTooLarge.
func ReadUpdateRequest(r io.Reader, lim Limits) (*UpdateRequest, []byte, error) {
	lim = lim.withDefaults()
	rec := &recorder{r: r, max: lim.MaxBytes}
	req, err := readUpdateRequest(rec, lim)
	return req, rec.buf.Bytes(), err
}

func readUpdateRequest(rec *recorder, lim Limits) (*UpdateRequest, error) {
	pr := NewReader(rec)
	req := &UpdateRequest{Commands: []Command{}}
	first := true
	for {
		pkt, err := pr.Next()
		if err != nil {
			if errors.Is(err, errTooLarge) {
				return nil, ErrTooLarge
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("%w: push request ended before its flush packet", ErrMalformed)
			}
			if errors.Is(err, ErrMalformed) {
				return nil, err
			}
			return nil, fmt.Errorf("pktline: reading push commands: %w", err)
		}
		switch pkt.Kind {
		case Flush:
			return req, nil
		case Data:
		default:
			return nil, fmt.Errorf("%w: unexpected special packet in push commands", ErrMalformed)
		}
		line := trimLF(pkt.Payload)
		if oid, ok := bytes.CutPrefix(line, []byte("shallow ")); ok && len(req.Commands) == 0 {
			if !isOID(oid) {
				return nil, fmt.Errorf("%w: bad shallow line", ErrMalformed)
			}
			req.Shallow = append(req.Shallow, string(oid))
			continue
		}
		if first {
			if bytes.HasPrefix(line, []byte("push-cert")) && (len(line) == 9 || line[9] == 0) {
				return nil, ErrSignedPush
			}
			if i := bytes.IndexByte(line, 0); i >= 0 {
				req.Capabilities = strings.Fields(string(line[i+1:]))
				line = line[:i]
			}
		}
		cmd, err := parseCommand(line)
		if err != nil {
			return nil, err
		}
		if len(req.Commands) >= lim.MaxCommands {
			return nil, ErrTooLarge
		}
		req.Commands = append(req.Commands, cmd)
		first = false
	}
}

// parseCommand parses "<old-oid> SP <new-oid> SP <refname>".
func parseCommand(line []byte) (Command, error) {
	parts := bytes.SplitN(line, []byte{' '}, 3)
	if len(parts) != 3 || !isOID(parts[0]) || !isOID(parts[1]) || len(parts[0]) != len(parts[1]) {
		return Command{}, fmt.Errorf("%w: bad ref update command", ErrMalformed)
	}
	ref := string(parts[2])
	if err := CheckRefName(ref); err != nil {
		return Command{}, err
	}
	return Command{Old: string(parts[0]), New: string(parts[1]), Ref: ref}, nil
}

// CheckRefName accepts the ref names git itself would accept in a push (git-check-ref-format
// without --allow-onelevel): "refs/…", no control characters, spaces or ~^:?*[\ , no "..", "@{",
// "//", no component starting with '.' or ending in ".lock", at most 1024 bytes. A name that passes
// is safe to print on one line.
func CheckRefName(ref string) error {
	bad := func(why string) error { return fmt.Errorf("%w: bad ref name (%s)", ErrMalformed, why) }
	if len(ref) == 0 || len(ref) > 1024 {
		return bad("length")
	}
	if !strings.HasPrefix(ref, "refs/") {
		return bad("not under refs/")
	}
	for i := 0; i < len(ref); i++ {
		c := ref[i]
		if c < 0x21 || c == 0x7f || strings.IndexByte("~^:?*[\\", c) >= 0 {
			return bad("forbidden character")
		}
	}
	if strings.Contains(ref, "..") || strings.Contains(ref, "@{") || strings.HasSuffix(ref, "/") || strings.HasSuffix(ref, ".") {
		return bad("forbidden sequence")
	}
	for _, comp := range strings.Split(ref, "/") {
		if comp == "" || comp[0] == '.' || strings.HasSuffix(comp, ".lock") {
			return bad("forbidden component")
		}
	}
	return nil
}

func isOID(b []byte) bool {
	if len(b) != 40 && len(b) != 64 {
		return false
	}
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

var errTooLarge = errors.New("pktline: limit")

// recorder keeps every byte read through it, up to max.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
	max int
}

func (rc *recorder) Read(p []byte) (int, error) {
	room := rc.max - rc.buf.Len()
	if room <= 0 {
		return 0, errTooLarge
	}
	if len(p) > room {
		p = p[:room]
	}
	n, err := rc.r.Read(p)
	rc.buf.Write(p[:n])
	return n, err
}
