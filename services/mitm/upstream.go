package mitm

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/IniZio/nexus/services/mitm/internal/http1"
)

// Upstream connections. Each guest connection (one tunnel) gets its own connection to the host it
// was opened for, used for that tunnel's requests in order, as the guest's own client would have
// used it: no connection carrying one sandbox's credential is ever reused for another's request,
// and a request costs no hand-off to a pool's goroutines.

const (
	upstreamDialTimeout      = 10 * time.Second
	upstreamHandshakeTimeout = 10 * time.Second
)

// staleCheckAfter: a kept connection idle longer than this is checked for a close the host sent
// meanwhile before it carries the next request (a variable for tests).
var staleCheckAfter = time.Second

// upstreamDialer reaches real hosts: TLS verified against the system roots plus
// Config.ExtraRootCAs, never through an environment proxy, with ResolverOverrides applied.
type upstreamDialer struct {
	dialer    *net.Dialer
	overrides map[string]string
	roots     *x509.CertPool
}

func newUpstreamDialer(cfg proxyConfig) (*upstreamDialer, error) {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	for _, c := range cfg.ExtraRootCAs {
		roots.AddCert(c)
	}
	overrides := map[string]string{}
	for k, v := range cfg.ResolverOverrides {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return nil, fmt.Errorf("mitm: resolver override %s=%s: want host:port", k, v)
		}
		overrides[k] = v
	}
	return &upstreamDialer{
		dialer:    &net.Dialer{Timeout: upstreamDialTimeout, KeepAlive: 30 * time.Second},
		overrides: overrides,
		roots:     roots,
	}, nil
}

// target is the address a tunnel to host:port dials: the one the netstack judged for the
// guest's connection (judged, from DialAddrHeader, an ip:port), else a resolver override's
// (a test aid: host:port, host, then "*"). The name is never resolved again here: a CONNECT
// with neither is refused. override reports that the address is the override's for this host
// (--resolve host=addr, the explicit allowance of exactly that host and address).
func (d *upstreamDialer) target(judged, host, port string) (addr string, override bool, err error) {
	ov, hasOv := d.overrides[net.JoinHostPort(host, port)]
	if !hasOv {
		ov, hasOv = d.overrides[host]
	}
	if !hasOv {
		ov, hasOv = d.overrides["*"]
	}
	if judged == "" {
		if !hasOv {
			return "", false, errors.New("CONNECT without the address the netstack judged for it")
		}
		return ov, true, nil
	}
	ap, err := netip.ParseAddrPort(judged)
	if err != nil || len(judged) > 64 || ap.Addr().Zone() != "" {
		return "", false, errors.New("CONNECT with a judged address that is not ip:port")
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if hasOv {
		if oa, err := netip.ParseAddrPort(ov); err == nil && oa.Addr().Unmap() == ap.Addr() {
			override = true
		}
	}
	return ap.String(), override, nil
}

// dial opens the tunnel's upstream connection: TCP to its address, then TLS naming its host when
// the guest spoke TLS. The address rule is applied again here, a second line behind the
// netstack: a refused address is a *netaddr.PrivateError and nothing is dialled.
func (d *upstreamDialer) dial(ctx context.Context, sess *session) (*upstreamConn, error) {
	addr := sess.addr
	if !sess.override {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, fmt.Errorf("mitm: dial %s: not ip:port", addr)
		}
		if err := sess.sb.guard.Check(ap.Addr()); err != nil {
			return nil, err
		}
	}
	c, err := d.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if sess.upstreamTLS() {
		tc := tls.Client(c, &tls.Config{
			ServerName: sess.host,
			RootCAs:    d.roots,
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
		})
		hctx, cancel := context.WithTimeout(ctx, upstreamHandshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	return &upstreamConn{conn: c, br: bufio.NewReader(c), bw: bufio.NewWriter(c), used: time.Now()}, nil
}

// upstreamConn is one tunnel's connection to its host.
type upstreamConn struct {
	conn net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time
}

// errStale marks a kept connection found closed before any byte of the answer came back.
var errStale = errors.New("mitm: kept upstream connection was closed by the host")

// roundTrip writes req (streaming its body) and reads the answer's head into resp, skipping
// informational answers other than 101. Closing the connection (the request's context ending)
// unblocks it.
func (u *upstreamConn) roundTrip(req *http1.Request, rw http1.Rewrite, resp *http1.Response) error {
	if err := http1.WriteRequest(u.bw, req, rw); err != nil {
		return err
	}
	if err := u.bw.Flush(); err != nil {
		return err
	}
	if _, err := u.br.Peek(1); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
			return fmt.Errorf("%w: %v", errStale, err)
		}
		return err
	}
	return resp.Read(u.br, req.Method, MaxRequestHeaderBytes)
}

// closedByHost reports whether the host closed the kept connection while it was idle: a read that
// cannot wait finds the end of the stream (or a reset) rather than nothing yet.
func (u *upstreamConn) closedByHost() bool {
	if time.Since(u.used) < staleCheckAfter {
		return false
	}
	// A deadline already past would not even look at what arrived: allow a moment.
	u.conn.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := u.br.Peek(1)
	u.conn.SetReadDeadline(time.Time{})
	if err == nil {
		return true // the host sent a byte nobody asked for: the stream is out of step
	}
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

func (u *upstreamConn) close() { u.conn.Close() }

func isReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}

// replayable: a request that may be sent again on a new connection when the kept one turned out
// closed: no body, and a method that does not change anything (or an idempotency key).
func replayable(r *http1.Request) bool {
	if r.Body != nil {
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	k1, _ := r.Get("Idempotency-Key")
	k2, _ := r.Get("X-Idempotency-Key")
	return len(k1) > 0 || len(k2) > 0
}
