package netstack

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/audit"
)

// serveShim is the transparent SNI→CONNECT shim for curated 443/80: complete the handshake, peek
// the ClientHello SNI (443) or HTTP Host (80), check that name itself against the allowlist (the
// destination IP alone is never trusted), then CONNECT <name>:<port> to mitm with the sandbox's
// identity, replay the peeked bytes and splice. Its one audit event is emitted after the check.
func (n *network) serveShim(r *tcp.ForwarderRequest, v verdict, f *flow) {
	guest, err := acceptGuest(r)
	if err != nil {
		n.emit(denyEvent(v.ev, "guest handshake failed"))
		return
	}
	port := v.ev.Port
	peeked, name, err := n.peekName(guest, port)
	ipHost := v.ev.Host
	v.ev.Layer = audit.LayerTLS
	if port == 80 {
		v.ev.Layer = audit.LayerHTTP
	}
	if err != nil {
		n.emit(denyEvent(v.ev, err.Error()))
		guest.abort()
		return
	}
	v.ev.Host = name
	f.sni, f.layer = name, v.ev.Layer
	_, allow := n.policy()
	rule, ok := allow.Match(name, port)
	if !ok {
		n.emit(denyEvent(v.ev, fmt.Sprintf("%s %s is not allowed on port %d (ip resolved from %s)", nameKind(port), name, port, ipHost)))
		guest.abort()
		return
	}
	v.ev.Rule = rule.String()
	v.ev.Reason = fmt.Sprintf("%s %s allowed", nameKind(port), name)

	var up net.Conn
	if n.svc.cfg.MITMAddr != "" || n.svc.cfg.MITMAddrFunc != nil {
		up, err = n.connectMITM(name, port, v.target)
		v.ev.Reason += "; via mitm"
	} else {
		ctx, cancel := context.WithTimeout(n.ctx, n.svc.cfg.DialTimeout)
		var d net.Dialer
		up, err = d.DialContext(ctx, "tcp", v.target)
		cancel()
	}
	if err != nil {
		n.emit(denyEvent(v.ev, v.ev.Reason+"; "+err.Error()))
		guest.abort()
		return
	}
	if _, err := up.Write(peeked); err != nil {
		up.Close()
		n.emit(denyEvent(v.ev, v.ev.Reason+"; upstream write failed"))
		guest.abort()
		return
	}
	n.emit(v.ev)
	n.splice(guest, up, f)
}

func nameKind(port int) string {
	if port == 80 {
		return "host"
	}
	return "sni"
}

// peekName reads the guest's first bytes until the SNI/Host parses, bounded in time and size.
func (n *network) peekName(g *guestConn, port int) ([]byte, string, error) {
	parse, limit := parseClientHello, maxClientHello+5*4
	if port == 80 {
		parse, limit = parseHTTPHost, maxHTTPHead
	}
	_ = g.SetReadDeadline(time.Now().Add(n.svc.cfg.PeekTimeout))
	defer g.SetReadDeadline(time.Time{})
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= limit {
				return nil, "", fmt.Errorf("%s: first bytes exceed %d without a complete request", nameKind(port), limit)
			}
			buf = append(buf, make([]byte, min(len(buf), limit-len(buf)))...)[:len(buf)]
		}
		k, err := g.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if k > 0 {
			name, perr := parse(buf)
			if perr == nil {
				return buf, name, nil
			}
			if !errors.Is(perr, errNeedMore) {
				return nil, "", fmt.Errorf("%s: %w", nameKind(port), perr)
			}
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil, "", fmt.Errorf("%s: no complete request within %s", nameKind(port), n.svc.cfg.PeekTimeout)
			}
			return nil, "", fmt.Errorf("%s: guest closed before a complete request", nameKind(port))
		}
	}
}

// connectMITM opens CONNECT name:port to mitm with the sandbox's identity and waits for 200.
// The CONNECT carries dial, the address this connection was judged for: the mitm dials it and
// never resolves name again. Errors never contain the token.
func (n *network) connectMITM(name string, port int, dial string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(n.ctx, n.svc.cfg.DialTimeout)
	defer cancel()
	addr := n.svc.cfg.MITMAddr
	if n.svc.cfg.MITMAddrFunc != nil {
		var err error
		if addr, err = n.svc.cfg.MITMAddrFunc(); err != nil {
			return nil, fmt.Errorf("mitm unavailable: %v", err)
		}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("mitm unavailable: %s", dialErrText(err))
	}
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	target := net.JoinHostPort(name, strconv.Itoa(port))
	auth := base64.StdEncoding.EncodeToString([]byte(n.id + ":" + n.token))
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\nProxy-Authorization: Basic " + auth +
		"\r\n" + mitmapi.DialAddrHeader + ": " + dial + "\r\n\r\n"
	if _, err := c.Write([]byte(req)); err != nil {
		c.Close()
		return nil, fmt.Errorf("mitm: write connect: %s", dialErrText(err))
	}
	// Read exactly the response head: bufio may not read past it, since the bytes after it are
	// the tunnel. A 1-byte reader keeps it exact; the head is small.
	br := bufio.NewReaderSize(oneByteReader{c}, 16)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, errors.New("mitm: unreadable connect response")
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, fmt.Errorf("mitm refused connect: %s", resp.Status)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// oneByteReader reads at most one byte per call so a bufio.Reader on it never buffers past what
// its caller consumed.
type oneByteReader struct{ c net.Conn }

func (r oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return r.c.Read(p)
}
