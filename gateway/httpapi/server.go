// Package httpapi is nexus's remote API (`nexus serve api`, `nexus up --api ADDR`): JSON over
// HTTP for every CLI capability, WebSocket for exec and attach, Server-Sent Events for following
// logs and the audit stream, an OpenAPI 3 document at /openapi.json, and the MCP tools of
// gateway/mcp over streamable HTTP at /mcp.
//
// Like the CLI and the MCP server it is a thin client of the gateway's bus API
// (pkg/api/gateway), connected as the bus user cli, so behaviour and errors match the CLI's.
// Every request carries an API token (`nexus token create`) whose scope (read, write, admin)
// must cover the route; every request is audited with the token's name on the durable audit
// stream (layer api, nexus.audit.api.<token>: `nexus audit tail --api`). It listens on loopback by default, and beyond it only with TLS; on loopback it still
// checks Host and Origin, so that a web page cannot reach it through DNS rebinding or a
// cross-site WebSocket.
package httpapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/gateway/mcp"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// Config configures the API server.
type Config struct {
	// Addr is host:port to listen on. A host that is not loopback needs TLSCert and TLSKey.
	Addr            string
	TLSCert, TLSKey string
	Home            home.Dir
	// Dial connects to the bus as user api (bus.UserAPI); the server dials once for itself and once for
	// its MCP server.
	Dial    func(ctx context.Context) (*nats.Conn, error)
	Log     zerolog.Logger
	Version string
	// Listener, when set, is used instead of listening on Addr (tests).
	Listener net.Listener
	// Build runs a Dockerfile build (`POST /v1/builds/{image}`) the way `nexus image build -f`
	// does; nil: the route answers 503.
	Build func(ctx context.Context, b DockerBuild) (vmmapi.ImageInfo, error)
}

// Service is the API server.
type Service struct {
	cfg      Config
	log      zerolog.Logger
	tokens   *Tokens
	tickets  tickets
	loopback bool
	tls      *tls.Config
	mcp      *mcp.Server
	handler  http.Handler

	mu    sync.Mutex
	nc    *nats.Conn
	audit *audit.Publisher // made on the first connection to the bus
}

// New checks cfg and builds the server; Run listens.
func New(cfg Config) (*Service, error) {
	if cfg.Dial == nil {
		return nil, errors.New("httpapi: Config.Dial is required")
	}
	if cfg.Home == "" {
		return nil, errors.New("httpapi: Config.Home is required")
	}
	addr := cfg.Addr
	if cfg.Listener != nil {
		addr = cfg.Listener.Addr().String()
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, errdefs.Invalid("api: %q is not host:port", addr)
	}
	s := &Service{cfg: cfg, log: cfg.Log, loopback: isLoopbackHost(host)}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return nil, errdefs.Invalid("api: give both --api-tls-cert and --api-tls-key, or neither")
	}
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, errdefs.Invalid("api: the TLS certificate and key: %v", err)
		}
		s.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if !s.loopback && s.tls == nil {
		return nil, errdefs.Refused("api: %s is not a loopback address: serving beyond loopback needs TLS (--api-tls-cert and --api-tls-key)", addr)
	}
	if s.tokens, err = OpenTokens(cfg.Home, cfg.Log); err != nil {
		return nil, err
	}
	if s.mcp, err = mcp.New(mcp.Config{Dial: cfg.Dial, Log: cfg.Log, Version: cfg.Version, Authorize: authorizeTool, AdjustCreate: limitCreate}); err != nil {
		return nil, err
	}
	s.handler = s.routes()
	return s, nil
}

// Handler is the whole API behind its guard (tests serve it with httptest).
func (s *Service) Handler() http.Handler { return s.handler }

// Run serves until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	defer s.mcp.Close()
	go s.connectAudit(ctx)
	ln := s.cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.cfg.Addr); err != nil {
			return fmt.Errorf("api: %w", err)
		}
	}
	if s.tls != nil {
		ln = tls.NewListener(ln, s.tls)
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	scheme := "http"
	if s.tls != nil {
		scheme = "https"
	}
	s.log.Info().Str("url", scheme+"://"+ln.Addr().String()).Msg("api listening")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("api: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.audit != nil {
		if err := s.audit.Close(sctx); err != nil {
			s.log.Warn().Err(err).Msg("api: audit events not yet acknowledged stay in the spool for the next start")
		}
	}
	if s.nc != nil {
		s.nc.Close()
	}
	return nil
}

// client returns a gateway client, dialling the bus when there is no live connection.
func (s *Service) client(ctx context.Context) (*api.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	nc, err := s.connLocked(ctx)
	if err != nil {
		return nil, err
	}
	return api.NewClient(nc), nil
}

func (s *Service) connLocked(ctx context.Context) (*nats.Conn, error) {
	if s.nc != nil && !s.nc.IsClosed() {
		return s.nc, nil
	}
	nc, err := s.cfg.Dial(ctx)
	if err != nil {
		return nil, errdefs.Unavailable("api: the bus: %v", err)
	}
	s.nc = nc
	return nc, nil
}

// auditor returns the publisher of the API's request events, starting it on the bus
// connection the first time. Its spool ($NEXUS_HOME/audit/api.spool) keeps what the bus has
// not acknowledged across a bus restart and a restart of the API; a request is served only
// once its event can be recorded.
func (s *Service) auditor(ctx context.Context) (*audit.Publisher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.audit != nil {
		return s.audit, nil
	}
	nc, err := s.connLocked(ctx)
	if err != nil {
		return nil, err
	}
	pub, err := audit.NewSpooledPublisher(nc, audit.APIService, s.log, s.cfg.Home.AuditSpool(audit.APIService),
		audit.WithLimits(audit.Unlimited), audit.WithKey(func(ev audit.Event) string { return audit.APIKey(ev.Token) }))
	if err != nil {
		return nil, errdefs.Unavailable("api: the audit spool: %v", err)
	}
	s.audit = pub
	return pub, nil
}

// connectAudit starts the auditor as soon as the bus answers, so that events a previous run
// left unacknowledged are published without waiting for a request.
func (s *Service) connectAudit(ctx context.Context) {
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		if _, err := s.auditor(ctx); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// caller is who sent a request: the token and its scope.
type caller struct{ token Token }

type callerKey struct{}

func callerOf(ctx context.Context) (Token, bool) {
	c, ok := ctx.Value(callerKey{}).(caller)
	return c.token, ok
}

// need refuses the request unless its token's scope covers scope; why says what needed it.
func need(r *http.Request, scope Scope, why string) error {
	tok, ok := callerOf(r.Context())
	if !ok {
		return errUnauthenticated
	}
	if !tok.Scope.Allows(scope) {
		return errdefs.Refused("token %s has scope %s: %s needs scope %s", tok.Name, tok.Scope, why, scope)
	}
	return nil
}

// errUnauthenticated is a request without a valid token: 401.
var errUnauthenticated = errors.New("a valid API token is required: send Authorization: Bearer <token> (nexus token create NAME)")

// guard checks, in order, the Host (loopback servers answer only to loopback names, so a
// rebound DNS name is refused), the Origin (a browser's cross-site request or WebSocket is
// refused), and the token; then it runs next and audits the request with the token's name.
// Without an audit stream to record it on, nothing is served (503).
func (s *Service) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		pub, err := s.auditor(r.Context())
		if err != nil {
			writeError(w, errdefs.Unavailable("api: every request is audited, and the audit stream cannot be reached: %v", err))
			return
		}
		rec := &statusRecorder{ResponseWriter: w}
		var tok Token
		err = s.admit(r)
		if err == nil {
			var ok bool
			if tok, ok = s.tokens.Lookup(bearer(r)); !ok {
				if tok, ok = s.ticketCaller(r); !ok {
					err = errUnauthenticated
				}
			}
		}
		if err != nil {
			writeError(rec, err)
		} else {
			r = r.WithContext(context.WithValue(r.Context(), callerKey{}, caller{token: tok}))
			next.ServeHTTP(rec, r)
		}
		pub.Emit(r.Context(), requestEvent(start, tok, r, rec.code()))
	})
}

// requestEvent is the audit record of a request: who (the token's name, never its secret)
// did what, and how it ended; never a body, a query or a header. Refusals (401, 403) are
// denials.
func requestEvent(start time.Time, tok Token, r *http.Request, status int) audit.Event {
	ev := audit.Event{Time: start.UTC(), Layer: audit.LayerAPI, Token: tok.Name, Method: r.Method, Rule: r.Pattern,
		Path: r.URL.EscapedPath(), Status: status, Decision: audit.Allow}
	if status == http.StatusUnauthorized || status == http.StatusForbidden {
		ev.Decision = audit.Deny
	}
	if host, port, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		ev.IP = host
		ev.Port, _ = strconv.Atoi(port)
	}
	if ev.Name = r.PathValue("name"); ev.Name == "" {
		ev.Name = r.PathValue("sandbox")
	}
	return ev
}

// admit checks Host and Origin.
func (s *Service) admit(r *http.Request) error {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if s.loopback && !isLoopbackHost(strings.Trim(host, "[]")) {
		return errdefs.Refused("api: Host %q is not a loopback name: this server answers to localhost and loopback addresses only", clip(r.Host))
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil // not a browser
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	u, err := url.Parse(origin)
	if err != nil || u.Scheme != scheme || !strings.EqualFold(u.Host, r.Host) {
		return errdefs.Refused("api: cross-origin request from %q refused", clip(origin))
	}
	return nil
}

func bearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(v, "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return ""
}

func clip(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// statusRecorder remembers the status a handler wrote; it passes Flush and Hijack through
// (event streams and WebSocket upgrades).
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(p)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := r.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("hijack not supported")
	}
	if r.status == 0 {
		r.status = http.StatusSwitchingProtocols
	}
	return h.Hijack()
}

func (r *statusRecorder) code() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}
