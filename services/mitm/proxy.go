// Package mitm is the TLS-intercepting egress proxy of a nexus host (DESIGN §5).
//
// The netstack shim opens `CONNECT host:port` with `Proxy-Authorization: Basic
// base64(<sandbox id>:<token>)` for every guest TLS/HTTP connection. Three parts serve it:
//
//   - goproxy accepts the CONNECT. elazarl/goproxy reads the CONNECT, the proxy identifies the
//     sandbox from its Proxy-Authorization, and goproxy hands the accepted connection over
//     (ConnectHijack). The proxy terminates the guest's TLS with a leaf minted by the
//     per-installation CA for the CONNECT host (a ClientHello naming another server is refused:
//     sni_mismatch), or takes the tunnel as plain HTTP (tunnel.go).
//   - The codec is ours: internal/http1 reads each request of the tunnel in order into the
//     tunnel's own buffer, as strictly as net/http would (fuzzed against it), bounded in size
//     and time, and writes it as the guest sent it less its hop-by-hop fields, with the bodies
//     framed by the proxy, to the tunnel's own upstream connection (upstream.go, forward.go).
//     Bodies stream both ways; trailers pass; a 101 is spliced (WebSockets).
//   - The decision is the ordered list of checks in judge.go, each named by the audit rule of
//     its refusals: bad_request (no CONNECT inside a tunnel), host_not_allowed (the tunnel's
//     host is on the sandbox's allowlist), host_mismatch (the Host field and target name that
//     host: the shared-CDN hole), placeholder_cleartext (no placeholder at all in a request
//     whose upstream leg is not TLS), placeholder_leak (a placeholder of the sandbox travels
//     only to a host it is bound to, looked for in every part of the request and in its
//     encoded forms: scan.go), http_policy (the sandbox's request policy, which names finer
//     rules), cred_refused (`Authorization: Bearer <placeholder>`, or the password of a Basic
//     one, swapped for the real credential from the Resolver; cred_unavailable when it cannot
//     be had). The first refusal answers the request (403 or 502, with X-Nexus-Deny); an
//     allowed request's rule is host_allowed, or the request policy's.
//
// Each request ends in one audit.Event, handed to the sink off the request path.
package mitm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/rs/zerolog"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/mitm/internal/http1"
)

// Log field keys.
const (
	logKeySandbox = "sandbox"
	logKeyHost    = "host"
	logKeyRule    = "rule"
	logKeyDropped = "dropped"
	logKeySource  = "source"
)

// Rules named in audit events.
const (
	RuleProxyAuth       = "proxy_auth"
	RuleBadTarget       = "bad_target"
	RuleHostAllowed     = "host_allowed"
	RuleHostNotAllowed  = "host_not_allowed"
	RuleHostMismatch    = "host_mismatch"
	RuleSNIMismatch     = "sni_mismatch"
	RulePlaceholderLeak = "placeholder_leak"
	// RulePlaceholderCleartext refuses any placeholder on a cleartext upstream leg: a real
	// credential is only ever sent over TLS.
	RulePlaceholderCleartext = "placeholder_cleartext"
	RuleHTTPPolicy           = "http_policy" // a request policy's refusal that names no finer rule
	RuleCredRefused          = "cred_refused"
	RuleCredUnavailable      = "cred_unavailable"
	RuleUpstreamError        = "upstream_error"
	RuleBadRequest           = "bad_request"
	RuleHeadTooLarge         = "request_head_too_large"
)

// DenyHeader carries the one-line reason of a refusal, also sent as the body.
const DenyHeader = "X-Nexus-Deny"

// UnknownSandbox is the audit sandbox of a CONNECT whose identity was not accepted.
const UnknownSandbox = "unknown"

// proxyConfig configures a Proxy.
type proxyConfig struct {
	// CADir holds the CA ($NEXUS_HOME/ca); created on first use.
	CADir string
	// Sandboxes identifies the sandbox behind each CONNECT.
	Sandboxes Sandboxes
	// Resolver turns a bound placeholder into the real credential. Without one, a request that
	// needs a swap is answered 502.
	Resolver Resolver
	// Audit receives one event per request, from a goroutine of its own. Nil discards.
	Audit  audit.Sink
	Logger zerolog.Logger

	// ExtraRootCAs are trusted for upstream TLS besides the system roots (tests).
	ExtraRootCAs []*x509.Certificate
	// ResolverOverrides maps a host name (or "host:port") to the address dialled instead, like
	// curl --resolve (tests). The key "*" matches every host.
	ResolverOverrides map[string]string

	// LeafCacheSize bounds the cached leaf certificates (default 1024).
	LeafCacheSize int
	// IdleTimeout closes a tunnel whose guest sent nothing for this long (default 10 minutes).
	IdleTimeout time.Duration
	// ResolveTimeout bounds one credential resolve (default 5 s).
	ResolveTimeout time.Duration
	// ResolveCacheTTL keeps a resolved credential for the sandbox's next requests to the same
	// host (default 30 s; negative: ask the Resolver every time). A sandbox keeps the value its
	// placeholder was minted for until it is recreated, so the cache changes no answer; it only
	// takes the credential broker off the path of every request.
	ResolveCacheTTL time.Duration
}

// Proxy is the MITM proxy.
type Proxy struct {
	cfg    proxyConfig
	log    zerolog.Logger
	ca     *CA
	leaves *leafCache
	gp     *goproxy.ProxyHttpServer
	dialer *upstreamDialer
	audit  *auditQueue

	tunnelAction *goproxy.ConnectAction
	rejectAction *goproxy.ConnectAction

	// ctx ends with Close: tunnels waiting on a host give up.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	servers map[*http.Server]struct{}
	conns   map[*idleConn]struct{}
}

// newProxy loads (or creates) the CA and builds the proxy. It does not listen: call Serve.
func newProxy(cfg proxyConfig) (*Proxy, error) {
	if cfg.Sandboxes == nil {
		return nil, errors.New("mitm: no Sandboxes configured")
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 10 * time.Minute
	}
	if cfg.ResolveTimeout <= 0 {
		cfg.ResolveTimeout = 5 * time.Second
	}
	if cfg.ResolveCacheTTL == 0 {
		cfg.ResolveCacheTTL = 30 * time.Second
	}
	sink := cfg.Audit
	if sink == nil {
		sink = audit.SinkFunc(func(context.Context, audit.Event) {})
	}
	ca, err := LoadOrCreateCA(cfg.CADir)
	if err != nil {
		return nil, err
	}
	dialer, err := newUpstreamDialer(cfg)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		cfg:     cfg,
		log:     cfg.Logger,
		ca:      ca,
		leaves:  newLeafCache(ca, cfg.LeafCacheSize),
		dialer:  dialer,
		audit:   newAuditQueue(sink, cfg.Logger),
		servers: map[*http.Server]struct{}{},
		conns:   map[*idleConn]struct{}{},
	}
	p.tunnelAction = &goproxy.ConnectAction{Action: goproxy.ConnectHijack, Hijack: p.hijack}
	p.rejectAction = &goproxy.ConnectAction{Action: goproxy.ConnectReject}
	p.ctx, p.cancel = context.WithCancel(context.Background())

	gp := goproxy.NewProxyHttpServer()
	gp.Logger = goproxyLogger{p.log}
	gp.ConnectDial = nil // never chain to an HTTPS_PROXY from the environment
	gp.KeepAcceptEncoding = true
	gp.AllowHTTP2 = false
	gp.OnRequest().HandleConnectFunc(p.onConnect)
	p.gp = gp
	return p, nil
}

// CACertPEM is the CA certificate guests must trust.
func (p *Proxy) CACertPEM() []byte { return p.ca.CertPEM() }

// Serve accepts CONNECTs on ln until Close. It returns nil after Close.
func (p *Proxy) Serve(ln net.Listener) error {
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 30 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(logWriter{p.log}, "", 0),
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("mitm: proxy is closed")
	}
	p.servers[srv] = struct{}{}
	p.mu.Unlock()
	err := srv.Serve(&trackedListener{Listener: ln, p: p})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops every Serve, closes all tunnels and flushes pending audit events to the sink.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	servers := p.servers
	conns := p.conns
	p.conns = map[*idleConn]struct{}{}
	p.mu.Unlock()
	for s := range servers {
		s.Close()
	}
	p.cancel()
	for c := range conns {
		c.Conn.Close()
	}
	p.audit.close()
	return nil
}

// ServeHTTP accepts only CONNECT: the netstack shim never sends anything else.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		msg := "nexus: refused: this is the nexus egress proxy; it accepts only CONNECT from the netstack"
		w.Header().Set(DenyHeader, msg)
		http.Error(w, msg, http.StatusMethodNotAllowed)
		return
	}
	p.gp.ServeHTTP(hijackNotifier{w}, r)
}

// session is one CONNECT tunnel.
type session struct {
	sb   *Sandbox
	host string // normalized CONNECT host
	port string
	addr string // ip:port dialled upstream (the netstack's judged address), whatever a request's Host says
	// override: addr is a resolver override's for host (--resolve), exempt from the address rule.
	override bool
	scheme   string // "https" when the guest spoke TLS in the tunnel, else "http": see upstreamTLS
	// up is the tunnel's connection to its host: used by one request at a time (the inner server
	// serves a tunnel's requests in order), closed from elsewhere only through dropUpstream.
	up      atomic.Pointer[upstreamConn]
	allowed bool
}

// upstreamTLS reports whether the tunnel's upstream leg is TLS: it is when the guest spoke TLS
// in the tunnel (the dialer does what the guest did). A credential is swapped only on such a leg.
func (s *session) upstreamTLS() bool { return s.scheme == "https" }

// reqState is one request inside a tunnel: what the checks found and decided about it, and what
// its audit event says.
type reqState struct {
	sess *session
	req  *http1.Request
	path string // the target's path, placeholders redacted
	// use is what the request carries of the sandbox's placeholders (checkPlaceholders).
	use placeholderUse
	// forms is the request's placeholder scan (its budget covers head and body); body scans the
	// body of a request of a sandbox with placeholders.
	forms forms
	body  *bodyScan
	// rewrite is how the request is forwarded: its credential swapped or dropped.
	rewrite http1.Rewrite
	swapped bool
	// reqBody counts the body of an allowed request.
	reqBody countingBody
	// rule is the request policy's rule for an allowed request ("" when no policy judged it).
	rule string
}

// allowRule is the rule an allowed request's audit event names.
func (rs *reqState) allowRule() string {
	if rs.rule != "" {
		return rs.rule
	}
	return RuleHostAllowed
}

func (p *Proxy) onConnect(target string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	r := ctx.Req
	sb, err := p.identify(r)
	if err != nil {
		host, _, _ := splitHostPort(target, "443")
		p.emit(audit.Event{Sandbox: UnknownSandbox, Layer: audit.LayerHTTP, Host: host, Method: http.MethodConnect,
			Status: http.StatusProxyAuthRequired, Decision: audit.Deny, Rule: RuleProxyAuth, Reason: "unknown sandbox identity"})
		p.log.Warn().Str(logKeyRule, RuleProxyAuth).Str(logKeySource, r.RemoteAddr).Msg("CONNECT with an unknown sandbox identity")
		resp := textResponse(r, http.StatusProxyAuthRequired, "nexus: refused: unknown sandbox identity")
		resp.Header.Set("Proxy-Authenticate", `Basic realm="nexus"`)
		ctx.Resp = resp
		return p.rejectAction, target
	}
	host, port, err := splitHostPort(target, "443")
	if err != nil {
		p.emit(audit.Event{Sandbox: sb.ID, Name: sb.Name, Layer: audit.LayerHTTP, Method: http.MethodConnect,
			Status: http.StatusBadRequest, Decision: audit.Deny, Rule: RuleBadTarget, Reason: "bad CONNECT target"})
		ctx.Resp = textResponse(r, http.StatusBadRequest, "nexus: refused: bad CONNECT target")
		return p.rejectAction, target
	}
	addr, override, err := p.dialer.target(r.Header.Get(mitmapi.DialAddrHeader), host, port)
	if err != nil {
		p.emit(audit.Event{Sandbox: sb.ID, Layer: audit.LayerHTTP, Host: host, Method: http.MethodConnect,
			Status: http.StatusBadRequest, Decision: audit.Deny, Rule: RuleBadTarget, Reason: err.Error()})
		ctx.Resp = textResponse(r, http.StatusBadRequest, "nexus: refused: "+err.Error())
		return p.rejectAction, target
	}
	ctx.UserData = &session{sb: sb, host: host, port: port, addr: addr, override: override, allowed: sb.AllowsHost(host)}
	return p.tunnelAction, target
}

// identify checks Proxy-Authorization: Basic base64(<sandbox id>:<token>).
func (p *Proxy) identify(r *http.Request) (*Sandbox, error) {
	v := r.Header.Get("Proxy-Authorization")
	id, token, ok := basicAuth(v)
	if !ok || id == "" || token == "" || len(id) > 256 {
		return nil, errdefs.Refused("no sandbox identity")
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	sb, err := p.cfg.Sandboxes.Lookup(ctx, id)
	if err != nil || sb == nil || !sb.tokenOK(token) {
		return nil, errdefs.Refused("unknown sandbox identity")
	}
	return sb, nil
}

var errSNIMismatch = errors.New("mitm: TLS server name does not match the CONNECT host")

// tlsConfig serves the guest's TLS with a leaf for the CONNECT host. A ClientHello naming any
// other server is refused: the tunnel's host is fixed by the CONNECT that the allowlist judged.
func (p *Proxy) tlsConfig(sess *session) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hello.ServerName != "" {
				sni, err := normalizeHost(hello.ServerName)
				if err != nil || sni != sess.host {
					p.emit(audit.Event{Sandbox: sess.sb.ID, Name: sess.sb.Name, Layer: audit.LayerTLS, Host: sess.host, Decision: audit.Deny,
						Rule: RuleSNIMismatch, Reason: "TLS server name differs from the CONNECT host"})
					return nil, errSNIMismatch
				}
			}
			return p.leaves.get(sess.host)
		},
	}
}

// resolve returns the real credential behind a placeholder of sb bound to host: from the
// sandbox's cache when it was released within ResolveCacheTTL, else from the Resolver. Refusals
// and failures are never cached.
func (p *Proxy) resolve(ctx context.Context, sb *Sandbox, host, placeholder string) (string, error) {
	key := releaseKey{host, placeholder}
	now := time.Now()
	sb.releasedMu.RLock()
	r, ok := sb.released[key]
	sb.releasedMu.RUnlock()
	if ok && now.Before(r.expires) {
		return r.value, nil
	}
	if p.cfg.Resolver == nil {
		return "", errdefs.Unavailable("no credential resolver")
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ResolveTimeout)
	defer cancel()
	value, err := p.cfg.Resolver.Resolve(ctx, sb.ID, host, placeholder)
	sb.releasedMu.Lock()
	defer sb.releasedMu.Unlock()
	if err != nil {
		delete(sb.released, key)
		return "", err
	}
	if p.cfg.ResolveCacheTTL > 0 {
		if sb.released == nil {
			sb.released = map[releaseKey]releasedSecret{}
		}
		// Expired entries go when the next credential is released: the map stays as small as the
		// sandbox's (host, placeholder) pairs.
		for k, v := range sb.released {
			if !now.Before(v.expires) {
				delete(sb.released, k)
			}
		}
		sb.released[key] = releasedSecret{value: value, expires: now.Add(p.cfg.ResolveCacheTTL)}
	}
	return value, nil
}

func (p *Proxy) emitRequest(rs *reqState, status int, respBytes int64, decision, rule, reason string) {
	p.emit(audit.Event{
		Sandbox: rs.sess.sb.ID, Name: rs.sess.sb.Name, Layer: audit.LayerHTTP, Host: rs.sess.host, Port: atoiPort(rs.sess.port),
		Method: rs.req.Method, Path: rs.path, Status: status, Bytes: respBytes + rs.reqBody.n,
		Decision: decision, Rule: rule, Reason: reason, Swapped: rs.swapped,
	})
}

func (p *Proxy) emit(ev audit.Event) {
	ev.Time = time.Now()
	p.audit.emit(ev)
}

// safeHost makes an untrusted host string printable on one line.
func safeHost(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x21 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
}

func atoiPort(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

func upstreamErrorClass(err error) string {
	var ce *tls.CertificateVerificationError
	var ne net.Error
	var bad *http1.Error
	switch {
	case errors.As(err, &ce):
		return "its TLS certificate is not trusted"
	case errors.As(err, &bad):
		return "its answer was not valid HTTP/1.1: " + malformedText(bad)
	case errors.Is(err, http1.ErrHeadTooLarge):
		return fmt.Sprintf("its answer's head was larger than %d bytes", MaxRequestHeaderBytes)
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case strings.Contains(err.Error(), "connection refused"):
		return "connection refused"
	case strings.Contains(err.Error(), "no such host"):
		return "no such host"
	default:
		return "connection failed"
	}
}

// textResponse is a short text/plain response; for refusals its one line is also X-Nexus-Deny.
func textResponse(req *http.Request, status int, line string) *http.Response {
	body := line + "\n"
	h := http.Header{}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set(DenyHeader, line)
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", status, http.StatusText(status)),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}

// countingBody counts the bytes of a request body read through it.
type countingBody struct {
	r io.Reader
	n int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}

// goproxyLogger sends goproxy's warnings to zerolog at debug level. goproxy may print URLs, so
// anything shaped like a placeholder is redacted first.
type goproxyLogger struct{ log zerolog.Logger }

func (l goproxyLogger) Printf(format string, v ...any) {
	l.log.Debug().Str(logKeySource, "goproxy").Msg(redactHex64(strings.TrimSpace(fmt.Sprintf(format, v...))))
}

type logWriter struct{ log zerolog.Logger }

func (w logWriter) Write(b []byte) (int, error) {
	w.log.Debug().Str(logKeySource, "http").Msg(redactHex64(strings.TrimSpace(string(b))))
	return len(b), nil
}
