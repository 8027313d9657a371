// Package httpapi is nexus's remote API (`nexus serve api`, `nexus up --api ADDR`): JSON over
// HTTP for every CLI capability, WebSocket for exec and attach, Server-Sent Events for following
// logs and the audit stream, an OpenAPI 3 document at /openapi.json, and the MCP tools of
// gateway/mcp over streamable HTTP at /mcp.
//
// Like the CLI and the MCP server it is a thin client of the gateway's bus API
// (pkg/api/gateway), connected as the bus user cli, so behaviour and errors match the CLI's.
// Every request carries an API token (`nexus token create`) whose scope (read, write, admin)
// must cover the route; every request is written to the API's request log with the token's
// name. It listens on loopback by default, and beyond it only with TLS; on loopback it still
// checks Host and Origin, so that a web page cannot reach it through DNS rebinding or a
// cross-site WebSocket.
package httpapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/gateway/mcp"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// Config configures the API server.
type Config struct {
	// Addr is host:port to listen on. A host that is not loopback needs TLSCert and TLSKey.
	Addr            string
	TLSCert, TLSKey string
	Home            home.Dir
	// Dial connects to the bus as user cli; the server dials once for itself and once for
	// its MCP server.
	Dial    func(ctx context.Context) (*nats.Conn, error)
	Log     zerolog.Logger
	Version string
	// Listener, when set, is used instead of listening on Addr (tests).
	Listener net.Listener
}

// Service is the API server.
type Service struct {
	cfg      Config
	log      zerolog.Logger
	tokens   *Tokens
	reqlog   *requestLog
	tickets  tickets
	loopback bool
	tls      *tls.Config
	mcp      *mcp.Server
	handler  http.Handler

	mu sync.Mutex
	nc *nats.Conn
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
	if s.reqlog, err = openRequestLog(filepath.Join(string(cfg.Home), "api", RequestLogName)); err != nil {
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
	defer s.reqlog.Close()
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
	if s.nc != nil {
		s.nc.Close()
	}
	s.mu.Unlock()
	return nil
}

// client returns a gateway client, dialling the bus when there is no live connection.
func (s *Service) client(ctx context.Context) (*api.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nc != nil && !s.nc.IsClosed() {
		return api.NewClient(s.nc), nil
	}
	nc, err := s.cfg.Dial(ctx)
	if err != nil {
		return nil, errdefs.Unavailable("api: the bus: %v", err)
	}
	s.nc = nc
	return api.NewClient(nc), nil
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
// refused), and the token; then it runs next and logs the request with the token's name.
func (s *Service) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		var tok Token
		err := s.admit(r)
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
		s.reqlog.write(requestEntry{Time: start.UTC(), Token: tok.Name, Scope: tok.Scope, Method: r.Method,
			Route: r.Pattern, Path: r.URL.EscapedPath(), Status: rec.code(), Remote: r.RemoteAddr,
			Millis: time.Since(start).Milliseconds()})
	})
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

// RequestLogName is the API's request log in $NEXUS_HOME/api: one JSON line per request.
const RequestLogName = "requests.log"

// maxRequestLog is the size at which the request log is rotated to requests.log.1.
const maxRequestLog = 16 << 20

// requestEntry is one line of the request log: who (the token's name) did what, and how it
// ended. It never holds a body, a query or a token secret.
type requestEntry struct {
	Time   time.Time `json:"time"`
	Token  string    `json:"token,omitempty"`
	Scope  Scope     `json:"scope,omitempty"`
	Method string    `json:"method"`
	Route  string    `json:"route,omitempty"`
	Path   string    `json:"path"`
	Status int       `json:"status"`
	Remote string    `json:"remote"`
	Millis int64     `json:"ms"`
}

type requestLog struct {
	mu   sync.Mutex
	path string
	f    *os.File
	size int64
}

func openRequestLog(path string) (*requestLog, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	l := &requestLog{path: path}
	return l, l.open()
}

func (l *requestLog) open() error {
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("api request log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, fi.Size()
	return nil
}

func (l *requestLog) write(e requestEntry) {
	b, _ := json.Marshal(e)
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	if l.size+int64(len(b)) > maxRequestLog {
		l.f.Close()
		os.Rename(l.path, l.path+".1")
		if l.open() != nil {
			l.f = nil
			return
		}
	}
	n, _ := l.f.Write(b)
	l.size += int64(n)
}

func (l *requestLog) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}
