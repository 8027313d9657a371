package mitm

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// MaxRequestHeaderBytes bounds a request line plus headers inside a tunnel; a guest that sends
// more is answered 431 and its connection closed.
const MaxRequestHeaderBytes = 64 << 10

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

type ctxKey int

const (
	sessionKey ctxKey = iota
)

// startInner builds the server that reads requests inside tunnels.
func (p *Proxy) startInner() {
	p.queue = newConnQueue()
	p.inner = &http.Server{
		Handler:           http.HandlerFunc(p.serveRequest),
		MaxHeaderBytes:    MaxRequestHeaderBytes,
		ReadHeaderTimeout: requestHeaderTimeout,
		IdleTimeout:       p.cfg.IdleTimeout,
		ErrorLog:          log.New(logWriter{p.log}, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tunnelConn); ok {
				return context.WithValue(ctx, sessionKey, tc.sess)
			}
			return ctx
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			// The conn's own goroutine calls this after its last request: the tunnel's upstream
			// connection goes with it.
			if tc, ok := c.(*tunnelConn); ok && st == http.StateClosed {
				tc.sess.dropUpstream()
			}
		},
	}
	go p.inner.Serve(p.queue)
}

// hijack takes over an accepted CONNECT: it answers 200, then either terminates the guest's TLS
// with the host's leaf or, when the first byte is not a TLS handshake, takes the tunnel as plain
// HTTP. The connection then joins the inner server. The netstack shim waits for the 200 before it
// sends a byte, so nothing the guest sent is left in the CONNECT's read buffer.
func (p *Proxy) hijack(r *http.Request, client net.Conn, ctx *goproxy.ProxyCtx) {
	sess := ctx.UserData.(*session)
	if err := p.openTunnel(r, client, sess); err != nil {
		client.Close()
		p.log.Debug().Str(logKeySandbox, sess.sb.ID).Str(logKeyHost, sess.host).Str("error", redactHex64(err.Error())).Msg("tunnel not opened")
	}
}

func (p *Proxy) openTunnel(r *http.Request, client net.Conn, sess *session) error {
	major, minor := r.ProtoMajor, r.ProtoMinor
	if major != 1 {
		major, minor = 1, 1
	}
	if _, err := fmt.Fprintf(client, "HTTP/%d.%d 200 Connection established\r\n\r\n", major, minor); err != nil {
		return err
	}
	deadline := time.Now().Add(tunnelHandshakeTimeout)
	client.SetDeadline(deadline)
	first := make([]byte, 1)
	if _, err := io.ReadFull(client, first); err != nil {
		return err
	}
	conn := net.Conn(&prefixConn{Conn: client, prefix: first})
	sess.scheme = "http"
	if first[0] == tlsRecordHandshake {
		tc := tls.Server(conn, p.tlsConfig(sess))
		hctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			return err
		}
		conn, sess.scheme = tc, "https"
	}
	client.SetDeadline(time.Time{})
	if !p.queue.push(&tunnelConn{Conn: conn, sess: sess}) {
		return net.ErrClosed
	}
	return nil
}

// serveRequest judges one request inside a tunnel and forwards it when allowed. The checks run in
// this order: host on the allowlist, Host header equals the tunnel's host, no placeholder bound
// elsewhere, the request policy, then the credential swap.
func (p *Proxy) serveRequest(w http.ResponseWriter, req *http.Request) {
	sess, ok := req.Context().Value(sessionKey).(*session)
	if !ok {
		http.Error(w, "nexus: refused: only CONNECT tunnels are served", http.StatusMethodNotAllowed)
		return
	}
	rs := &reqState{sess: sess, method: req.Method, path: redactPlaceholders(sess.sb, req.URL.Path)}
	sb := sess.sb

	if !sess.allowed {
		p.refuse(w, req, rs, http.StatusForbidden, RuleHostNotAllowed, notAllowedReason(sess.host))
		return
	}
	if h, ok := requestHost(req, sess.port); !ok || h != sess.host {
		p.refuse(w, req, rs, http.StatusForbidden, RuleHostMismatch, mismatchReason(h, sess.host))
		return
	}
	use := scanPlaceholders(sb, req, sess.host)
	if use.leak {
		p.refuse(w, req, rs, http.StatusForbidden, RulePlaceholderLeak, fmt.Sprintf(
			"nexus: refused: a nexus credential placeholder was sent to %s, which it is not bound to (bind the secret to that host with --secret NAME@%s or egress.secrets[].hosts in .nexus/config.yaml)",
			sess.host, sess.host))
		return
	}
	if sb.Policy != nil {
		v := sb.Policy.Decide(req, sess.host)
		if v.Deny {
			rule := v.Rule
			if rule == "" {
				rule = "http_policy"
			}
			reason := oneLine(v.Reason)
			if reason == "" {
				reason = fmt.Sprintf("nexus: refused: %s %s is not allowed by this sandbox's request policy for %s", req.Method, rs.path, sess.host)
			}
			p.refuse(w, req, rs, http.StatusForbidden, rule, reason)
			return
		}
		rs.rule = v.Rule
		if v.StripCredential && (use.bearer != "" || use.basicPass != "") {
			req.Header.Del("Authorization")
			use.bearer, use.basicPass = "", ""
		}
	}
	if use.bearer != "" || use.basicPass != "" {
		placeholder := use.bearer
		if placeholder == "" {
			placeholder = use.basicPass
		}
		secret, err := p.resolve(req.Context(), sb, sess.host, placeholder)
		if err != nil {
			if errors.Is(err, errdefs.ErrRefused) {
				p.refuse(w, req, rs, http.StatusForbidden, RuleCredRefused, fmt.Sprintf(
					"nexus: refused: the credential bound to %s was not released for this sandbox (recreate the sandbox to pick up the current secret)", sess.host))
				return
			}
			p.log.Warn().Str(logKeySandbox, sb.ID).Str(logKeyHost, sess.host).Str("error", redactHex64(err.Error())).Msg("credential resolve failed")
			p.refuse(w, req, rs, http.StatusBadGateway, RuleCredUnavailable, fmt.Sprintf(
				"nexus: the credential for %s is unavailable right now (check `nexus secret ls` and that credbroker is running)", sess.host))
			return
		}
		if use.bearer != "" {
			req.Header.Set("Authorization", "Bearer "+secret)
		} else {
			req.SetBasicAuth(use.basicUser, secret)
		}
		rs.swapped = true
	}
	if req.Body != nil && req.Body != http.NoBody {
		rs.reqBody = &countingBody{ReadCloser: req.Body}
		req.Body = rs.reqBody
	}
	p.forward(w, req, rs)
}

// refuse answers a refused request with its one-line reason (body and X-Nexus-Deny) and audits
// it. A body the guest is still sending is not waited for: the connection closes after the answer.
func (p *Proxy) refuse(w http.ResponseWriter, req *http.Request, rs *reqState, status int, rule, reason string) {
	if req.Body != nil && req.Body != http.NoBody {
		w.Header().Set("Connection", "close")
	}
	writeLine(w, status, reason)
	p.emitRequest(rs, status, 0, audit.Deny, rule, reason)
	p.log.Info().Str(logKeySandbox, rs.sess.sb.ID).Str(logKeyHost, rs.sess.host).Str(logKeyRule, rule).Msg("request refused")
}

// writeLine writes a short text/plain answer whose one line is also X-Nexus-Deny.
func writeLine(w http.ResponseWriter, status int, line string) {
	body := line + "\n"
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set(DenyHeader, line)
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// tunnelConn is a tunnel handed to the inner server, carrying the session it was opened for.
type tunnelConn struct {
	net.Conn
	sess *session
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

// connQueue is the inner server's listener: tunnels arrive from hijack, not from a socket.
type connQueue struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnQueue() *connQueue {
	return &connQueue{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

// push hands a tunnel to the server; false once the queue is closed.
func (q *connQueue) push(c net.Conn) bool {
	select {
	case q.ch <- c:
		return true
	case <-q.done:
		return false
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return tunnelAddr{} }

type tunnelAddr struct{}

func (tunnelAddr) Network() string { return "tunnel" }
func (tunnelAddr) String() string  { return "mitm-tunnels" }

// dropUpstream closes the tunnel's upstream connection, if any; the next request dials anew.
func (s *session) dropUpstream() {
	if up := s.up.Swap(nil); up != nil {
		up.close()
	}
}
