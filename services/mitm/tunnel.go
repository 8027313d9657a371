package mitm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/services/mitm/internal/http1"
)

// MaxRequestHeaderBytes bounds a request line plus headers inside a tunnel; a guest that sends
// more is answered 431 and its connection closed.
const MaxRequestHeaderBytes = 64 << 10

// maxDrainBytes is how much of a request body nobody read is skipped to keep the connection;
// more, and the connection closes instead.
const maxDrainBytes = 256 << 10

// Deadlines of the HTTP inside a tunnel (variables for tests). A guest that opens a tunnel and
// says nothing, or dribbles a request head, is dropped.
var (
	// tunnelHandshakeTimeout bounds the wait for the guest's first byte and its TLS handshake.
	tunnelHandshakeTimeout = 30 * time.Second
	// requestHeaderTimeout bounds reading one request head.
	requestHeaderTimeout = 30 * time.Second
)

// tlsRecordHandshake is the first byte of a TLS ClientHello record.
const tlsRecordHandshake = 0x16

// hijack takes over an accepted CONNECT: it answers 200, then either terminates the guest's TLS
// with the host's leaf or, when the first byte is not a TLS handshake, takes the tunnel as plain
// HTTP, and serves the tunnel's requests until it closes. The netstack shim waits for the 200
// before it sends a byte, so nothing the guest sent is left in the CONNECT's read buffer.
func (p *Proxy) hijack(r *http.Request, client net.Conn, ctx *goproxy.ProxyCtx) {
	sess := ctx.UserData.(*session)
	conn, err := p.openTunnel(r, client, sess)
	if err != nil {
		client.Close()
		p.log.Debug().Str(logKeySandbox, sess.sb.ID).Str(logKeyHost, sess.host).Str("error", redactHex64(err.Error())).Msg("tunnel not opened")
		return
	}
	p.serveTunnel(conn, sess)
}

func (p *Proxy) openTunnel(r *http.Request, client net.Conn, sess *session) (net.Conn, error) {
	major, minor := r.ProtoMajor, r.ProtoMinor
	if major != 1 {
		major, minor = 1, 1
	}
	if _, err := fmt.Fprintf(client, "HTTP/%d.%d 200 Connection established\r\n\r\n", major, minor); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(tunnelHandshakeTimeout)
	client.SetDeadline(deadline)
	first := make([]byte, 1)
	if _, err := io.ReadFull(client, first); err != nil {
		return nil, err
	}
	conn := net.Conn(&prefixConn{Conn: client, prefix: first})
	sess.scheme = "http"
	if first[0] == tlsRecordHandshake {
		tc := tls.Server(conn, p.tlsConfig(sess))
		hctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			return nil, err
		}
		conn, sess.scheme = tc, "https"
	}
	client.SetDeadline(time.Time{})
	return conn, nil
}

// tunnel is the guest's side of one tunnel: its requests are read and answered in order.
type tunnel struct {
	p    *Proxy
	conn net.Conn
	sess *session
	br   *bufio.Reader
	bw   *bufio.Writer
	req  http1.Request  // reused for each request: its buffers are the tunnel's
	resp http1.Response // likewise for the host's answers
	rs   reqState       // likewise for what the checks make of each request
}

// serveTunnel reads the guest's requests one at a time and answers each: refused, or forwarded
// over the tunnel's upstream connection. Reading a request head is bounded in size (431) and
// time; between requests the tunnel may idle for IdleTimeout.
func (p *Proxy) serveTunnel(conn net.Conn, sess *session) {
	t := &tunnel{p: p, conn: conn, sess: sess}
	t.br = bufio.NewReaderSize(conn, 4<<10)
	t.bw = bufio.NewWriterSize(conn, 4<<10)
	// Closing the proxy ends a wait for the host or the guest.
	stop := context.AfterFunc(p.ctx, func() {
		sess.dropUpstream()
		conn.Close()
	})
	defer stop()
	defer func() {
		if v := recover(); v != nil {
			p.log.Error().Str(logKeySandbox, sess.sb.ID).Str(logKeyHost, sess.host).Str("panic", redactHex64(fmt.Sprint(v))).Msg("tunnel failed")
		}
		sess.dropUpstream()
		conn.Close()
	}()
	for t.serveOne() {
	}
}

// serveOne serves one request; false ends the tunnel.
func (t *tunnel) serveOne() bool {
	// The guest connection's own idle deadline bounds this wait (idleConn).
	if _, err := t.br.Peek(1); err != nil {
		return false // closed, or idle too long
	}
	// A head that arrived whole is parsed from the buffer; one still coming must come in time.
	deadline := !headBuffered(t.br)
	if deadline {
		t.conn.SetReadDeadline(time.Now().Add(requestHeaderTimeout))
	}
	req := &t.req
	err := req.Read(t.br, MaxRequestHeaderBytes)
	if deadline {
		t.conn.SetReadDeadline(time.Time{})
	}
	if err != nil {
		var bad *http1.Error
		switch {
		case errors.Is(err, http1.ErrHeadTooLarge):
			t.refuseUnread(http.StatusRequestHeaderFieldsTooLarge, RuleHeadTooLarge, fmt.Sprintf("nexus: refused: request head larger than %d bytes", MaxRequestHeaderBytes))
		case errors.Is(err, http1.ErrVersion):
			t.refuseUnread(http.StatusHTTPVersionNotSupported, RuleBadRequest, "nexus: refused: only HTTP/1.x is served in a tunnel")
		case errors.As(err, &bad):
			t.refuseUnread(http.StatusBadRequest, RuleBadRequest, "nexus: refused: malformed HTTP message: "+malformedText(bad))
		}
		return false // a timeout or a guest that went away: nobody to answer
	}
	if req.ExpectContinue && req.Body != nil {
		req.Body = &continueBody{r: req.Body, t: t}
	}
	t.rs = reqState{sess: t.sess, req: req, path: auditPath(t.sess.sb, req.URL.Path),
		rewrite: http1.Rewrite{DefaultHost: t.sess.addr}}
	rs := &t.rs
	var keep bool
	if v := t.p.judge(rs); v != nil {
		keep = t.refuse(rs, v)
	} else {
		keep = t.p.forward(t, rs)
	}
	if !keep || req.Close {
		return false
	}
	// Whatever of the request body nobody read is skipped, within reason.
	if req.Body != nil {
		n, err := io.CopyN(io.Discard, req.Body, maxDrainBytes+1)
		if n > maxDrainBytes || (err != nil && !errors.Is(err, io.EOF)) {
			return false
		}
	}
	return true
}

// headBuffered reports whether the buffer holds a whole head (up to its empty line; a bare LF
// line end is taken too).
func headBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.Contains(b, []byte("\n\r\n")) || bytes.Contains(b, []byte("\n\n"))
}

// refuse answers a refused request with its one-line reason (body and X-Nexus-Deny) and audits
// it. A body the guest is still sending is not waited for: the connection closes after the
// answer. It reports whether the tunnel goes on.
func (t *tunnel) refuse(rs *reqState, v *verdict) bool {
	closeAfter := rs.req.Body != nil
	t.writeLine(v.status, v.reason, closeAfter)
	t.p.emitRequest(rs, v.status, 0, audit.Deny, v.rule, v.reason)
	t.p.log.Info().Str(logKeySandbox, rs.sess.sb.ID).Str(logKeyHost, rs.sess.host).Str(logKeyRule, v.rule).Msg("request refused")
	return !closeAfter
}

// refuseUnread answers a request that could not be read whole, audits it, and closes.
func (t *tunnel) refuseUnread(status int, rule, reason string) {
	t.writeLine(status, reason, true)
	t.p.emit(audit.Event{Sandbox: t.sess.sb.ID, Name: t.sess.sb.Name, Layer: audit.LayerHTTP, Host: t.sess.host, Port: atoiPort(t.sess.port),
		Status: status, Decision: audit.Deny, Rule: rule, Reason: reason})
	t.p.log.Info().Str(logKeySandbox, t.sess.sb.ID).Str(logKeyHost, t.sess.host).Str(logKeyRule, rule).Msg("request refused")
}

// writeLine answers with a short text/plain body whose one line is also X-Nexus-Deny.
func (t *tunnel) writeLine(status int, line string, closeAfter bool) {
	resp := textResponse(nil, status, line)
	resp.Close = closeAfter // Response.Write says Connection: close
	resp.Write(t.bw)
	t.bw.Flush()
}

// continueBody sends the guest the 100 Continue its request waits for when the body is first
// read (it is never read for a refused request, whose answer then closes the connection).
type continueBody struct {
	r    io.Reader
	t    *tunnel
	sent bool
}

func (b *continueBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		b.t.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		if err := b.t.bw.Flush(); err != nil {
			return 0, err
		}
	}
	return b.r.Read(p)
}

// malformedText is an http1.Error as the guest, the audit and the logs see it: one printable
// line, anything shaped like a placeholder redacted before the peer's bytes are clipped.
func malformedText(e *http1.Error) string {
	s := e.Reason
	if e.Name != "" {
		s += " " + redactHex64(e.Name)
	}
	if e.Value != nil {
		s += " " + safeBytes(e.Value)
	}
	return s
}

// safeBytes quotes at most 64 bytes of untrusted input, printable and on one line, with
// anything shaped like a placeholder redacted first (cutting one short would hide it from the
// redaction).
func safeBytes(b []byte) string {
	s := redactHex64(string(b))
	if len(s) > 64 {
		s = s[:64]
	}
	return strconv.QuoteToASCII(s)
}

// errText is err for a log line, with nothing shaped like a placeholder in it.
func errText(err error) string {
	if bad := (*http1.Error)(nil); errors.As(err, &bad) {
		return "malformed HTTP message: " + malformedText(bad)
	}
	return redactHex64(err.Error())
}

// prefixConn replays the byte read to tell TLS from plain HTTP before reading on.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// dropUpstream closes the tunnel's upstream connection, if any; the next request dials anew.
func (s *session) dropUpstream() {
	if up := s.up.Swap(nil); up != nil {
		up.close()
	}
}
