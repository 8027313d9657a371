package mitm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
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
	req  request  // reused for each request: its buffers are the tunnel's
	resp response // likewise for the host's answers
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
	err := req.read(t.br)
	if deadline {
		t.conn.SetReadDeadline(time.Time{})
	}
	if err != nil {
		var bad *malformedError
		var version *versionError
		switch {
		case errors.Is(err, errHeadTooLarge):
			t.refuseUnread(http.StatusRequestHeaderFieldsTooLarge, RuleHeadTooLarge, fmt.Sprintf("nexus: refused: request head larger than %d bytes", MaxRequestHeaderBytes))
		case errors.As(err, &version):
			t.refuseUnread(http.StatusHTTPVersionNotSupported, RuleBadRequest, "nexus: refused: only HTTP/1.x is served in a tunnel")
		case errors.As(err, &bad):
			t.refuseUnread(http.StatusBadRequest, RuleBadRequest, "nexus: refused: "+bad.Error())
		}
		return false // a timeout or a guest that went away: nobody to answer
	}
	if req.expectContinue && req.body != nil {
		req.body = &continueBody{r: req.body, t: t}
	}
	rs := &reqState{sess: t.sess, method: req.method, path: redactPlaceholders(t.sess.sb, req.url.Path)}
	var keep bool
	if v := t.p.judge(req, rs); v != nil {
		keep = t.refuse(req, rs, v)
	} else {
		keep = t.p.forward(t, req, rs)
	}
	if !keep || req.close {
		return false
	}
	// Whatever of the request body nobody read is skipped, within reason.
	if req.body != nil {
		n, err := io.CopyN(io.Discard, req.body, maxDrainBytes+1)
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

// verdict is a refusal: the status, the audit rule and the one-line reason.
type verdict struct {
	status int
	rule   string
	reason string
}

// judge decides one request inside a tunnel and, when it is allowed, swaps its credential. The
// checks run in this order: host on the allowlist, Host header equals the tunnel's host, no
// placeholder bound elsewhere, the request policy, then the credential swap. nil allows.
func (p *Proxy) judge(req *request, rs *reqState) *verdict {
	sess := rs.sess
	sb := sess.sb
	if req.method == http.MethodConnect {
		return &verdict{http.StatusMethodNotAllowed, RuleBadRequest, "nexus: refused: CONNECT inside a tunnel (open a new connection to the other host instead)"}
	}
	if !sess.allowed {
		return &verdict{http.StatusForbidden, RuleHostNotAllowed, notAllowedReason(sess.host)}
	}
	// The Host field as the guest's client writes it is the tunnel's host itself: nothing to
	// normalise.
	if req.host != sess.host || req.url.Host != "" {
		if h, ok := requestHost(req.host, req.url.Host, sess.port); !ok || h != sess.host {
			return &verdict{http.StatusForbidden, RuleHostMismatch, mismatchReason(h, sess.host)}
		}
	}
	use := scanPlaceholders(sb, req, sess.host)
	if use.leak {
		return leakVerdict(sess.host)
	}
	if req.chunk != nil {
		// Trailer fields come after the body: they are looked at when they arrive.
		req.chunk.check = func(tr *head) error {
			if trailerLeaks(sb, tr, sess.host) {
				return errTrailerLeak
			}
			return nil
		}
	}
	if sb.Policy != nil {
		hr := req.httpRequest()
		v := sb.Policy.Decide(hr, sess.host)
		req.body = bodyOf(hr) // the policy may have read part of it and put it back
		if v.Deny {
			rule := v.Rule
			if rule == "" {
				rule = "http_policy"
			}
			reason := errdefs.FirstLine(v.Reason)
			if reason == "" {
				reason = fmt.Sprintf("nexus: refused: %s %s is not allowed by this sandbox's request policy for %s", req.method, rs.path, sess.host)
			}
			return &verdict{http.StatusForbidden, rule, reason}
		}
		rs.rule = v.Rule
		if v.StripCredential && (use.bearer != "" || use.basicPass != "") {
			req.stripAuth = true
			use.bearer, use.basicPass = "", ""
		}
	}
	if use.bearer != "" || use.basicPass != "" {
		placeholder := use.bearer
		if placeholder == "" {
			placeholder = use.basicPass
		}
		secret, err := p.resolve(context.Background(), sb, sess.host, placeholder)
		if err != nil {
			if errors.Is(err, errdefs.ErrRefused) {
				return &verdict{http.StatusForbidden, RuleCredRefused, fmt.Sprintf(
					"nexus: refused: the credential bound to %s was not released for this sandbox (recreate the sandbox to pick up the current secret)", sess.host)}
			}
			p.log.Warn().Str(logKeySandbox, sb.ID).Str(logKeyHost, sess.host).Str("error", redactHex64(err.Error())).Msg("credential resolve failed")
			return &verdict{http.StatusBadGateway, RuleCredUnavailable, fmt.Sprintf(
				"nexus: the credential for %s is unavailable right now (check `nexus secret ls` and that credbroker is running)", sess.host)}
		}
		if !validFieldValue(secret) {
			p.log.Warn().Str(logKeySandbox, sb.ID).Str(logKeyHost, sess.host).Msg("credential holds a control character (a line break?): not sent")
			return &verdict{http.StatusBadGateway, RuleCredUnavailable, fmt.Sprintf(
				"nexus: the credential for %s is not a valid header value (set it again without line breaks: `nexus secret set`)", sess.host)}
		}
		if use.bearer != "" {
			req.auth = "Bearer " + secret
		} else {
			req.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(use.basicUser+":"+secret))
		}
		rs.swapped = true
	}
	if req.body != nil {
		rs.reqBody = &countingBody{r: req.body}
		req.body = rs.reqBody
	}
	return nil
}

func leakVerdict(host string) *verdict {
	return &verdict{http.StatusForbidden, RulePlaceholderLeak, fmt.Sprintf(
		"nexus: refused: a nexus credential placeholder was sent to %s, which it is not bound to (bind the secret to that host with --secret NAME@%s or egress.secrets[].hosts in .nexus/config.yaml)",
		host, host)}
}

// refuse answers a refused request with its one-line reason (body and X-Nexus-Deny) and audits
// it. A body the guest is still sending is not waited for: the connection closes after the
// answer. It reports whether the tunnel goes on.
func (t *tunnel) refuse(req *request, rs *reqState, v *verdict) bool {
	closeAfter := req.body != nil
	t.writeLine(v.status, v.reason, closeAfter)
	t.p.emitRequest(rs, v.status, 0, audit.Deny, v.rule, v.reason)
	t.p.log.Info().Str(logKeySandbox, rs.sess.sb.ID).Str(logKeyHost, rs.sess.host).Str(logKeyRule, v.rule).Msg("request refused")
	return !closeAfter
}

// refuseUnread answers a request that could not be read whole, audits it, and closes.
func (t *tunnel) refuseUnread(status int, rule, reason string) {
	t.writeLine(status, reason, true)
	t.p.emit(audit.Event{Sandbox: t.sess.sb.ID, Layer: audit.LayerHTTP, Host: t.sess.host, Port: atoiPort(t.sess.port),
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
