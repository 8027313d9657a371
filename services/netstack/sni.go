package netstack

import (
	"encoding/binary"
	"errors"

	"github.com/IniZio/nexus/pkg/policy"
)

// Limits for peeking a guest's first bytes. A ClientHello with post-quantum key shares is ~2 KiB;
// anything beyond these bounds is refused rather than buffered.
const (
	maxClientHello = 32 << 10 // handshake message bytes, across records
	maxTLSRecord   = 16384 + 2048
	maxHTTPHead    = 16 << 10
)

var (
	// errNeedMore means the bytes so far are a valid prefix: read more and parse again.
	errNeedMore = errors.New("need more data")
	errNotTLS   = errors.New("not a tls handshake")
	errNoSNI    = errors.New("client hello has no server name")
	errBadHello = errors.New("malformed client hello")
	errTooLarge = errors.New("client hello too large")
)

// parseClientHello returns the server name (lowercase, no trailing dot) from the TLS ClientHello
// at the start of b. The handshake message may span several records. It returns errNeedMore when
// b is an incomplete but so far valid prefix.
func parseClientHello(b []byte) (string, error) {
	var msg []byte // handshake bytes gathered from records
	for len(b) > 0 {
		if len(b) < 5 {
			return "", errNeedMore
		}
		if b[0] != 22 { // handshake
			return "", errNotTLS
		}
		if b[1] != 3 {
			return "", errNotTLS
		}
		n := int(binary.BigEndian.Uint16(b[3:5]))
		if n == 0 || n > maxTLSRecord {
			return "", errBadHello
		}
		if len(b) < 5+n {
			// Keep what we have: if the message is already complete inside this partial record
			// there is no need to wait for the rest of it.
			msg = append(msg, b[5:]...)
			b = nil
			break
		}
		msg = append(msg, b[5:5+n]...)
		b = b[5+n:]
		if len(msg) >= 4 && len(msg) >= 4+hsLen(msg) {
			break
		}
	}
	if len(msg) < 4 {
		return "", errNeedMore
	}
	if msg[0] != 1 { // client_hello
		return "", errNotTLS
	}
	l := hsLen(msg)
	if l > maxClientHello {
		return "", errTooLarge
	}
	if len(msg) < 4+l {
		return "", errNeedMore
	}
	return parseHelloBody(msg[4 : 4+l])
}

func hsLen(msg []byte) int { return int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]) }

// reader is a bounds-checked cursor; any short read sets bad.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) bytes(n int) []byte {
	if r.bad || n < 0 || len(r.b) < n {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() int {
	v := r.bytes(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() int {
	v := r.bytes(2)
	if v == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(v))
}

func parseHelloBody(body []byte) (string, error) {
	r := &reader{b: body}
	r.bytes(2)  // legacy_version
	r.bytes(32) // random
	if sid := r.u8(); sid > 32 {
		return "", errBadHello
	} else {
		r.bytes(sid)
	}
	cs := r.u16()
	if cs%2 != 0 {
		return "", errBadHello
	}
	r.bytes(cs)
	r.bytes(r.u8()) // compression methods
	if r.bad {
		return "", errBadHello
	}
	if len(r.b) == 0 {
		return "", errNoSNI // no extensions at all
	}
	exts := &reader{b: r.bytes(r.u16())}
	if r.bad {
		return "", errBadHello
	}
	for len(exts.b) > 0 {
		typ := exts.u16()
		data := exts.bytes(exts.u16())
		if exts.bad {
			return "", errBadHello
		}
		if typ != 0 { // server_name
			continue
		}
		sn := &reader{b: data}
		list := &reader{b: sn.bytes(sn.u16())}
		if sn.bad || len(sn.b) != 0 {
			return "", errBadHello
		}
		for len(list.b) > 0 {
			nameType := list.u8()
			name := list.bytes(list.u16())
			if list.bad {
				return "", errBadHello
			}
			if nameType != 0 { // host_name
				continue
			}
			h, err := policy.NormalizeHost(string(name))
			if err != nil {
				return "", errBadHello
			}
			return h, nil
		}
		return "", errNoSNI
	}
	return "", errNoSNI
}
