package mitm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/IniZio/nexus/pkg/audit"
)

// forward sends an allowed request over the tunnel's upstream connection and relays the answer:
// streamed both ways, trailers kept, a 101 spliced. The audit event is emitted once the answer's
// body has been relayed (at once for a protocol switch, whose spliced bytes are not counted). It
// reports whether the tunnel goes on.
func (p *Proxy) forward(t *tunnel, req *http.Request, rs *reqState) bool {
	if err := outbound(req); err != nil {
		return t.refuse(req, rs, &verdict{http.StatusBadRequest, RuleBadRequest, "nexus: refused: " + err.Error()})
	}
	resp, err := p.exchange(p.ctx, rs.sess, req)
	if err != nil {
		p.upstreamFailed(t, rs, err)
		return false
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		p.switchProtocols(t, rs, resp)
		return false
	}
	return p.relay(t, req, rs, resp)
}

// outbound makes req the request as the host receives it: without the headers of the guest's
// hop and otherwise as the guest wrote it (its target, its query, its forwarding headers; no
// User-Agent or Accept-Encoding of ours). It is sent to the tunnel's own host whatever the
// request line says. The guest's header map is changed in place: nothing else reads it after.
func outbound(req *http.Request) error {
	h := req.Header
	up := upgradeType(h)
	if !printable(up) {
		return fmt.Errorf("invalid Upgrade protocol")
	}
	trailers := false
	for _, v := range h["Te"] {
		trailers = trailers || strings.Contains(strings.ToLower(v), "trailers")
	}
	removeHopHeaders(h)
	if trailers {
		h["Te"] = []string{"trailers"}
	}
	if up != "" {
		h["Connection"] = []string{"Upgrade"}
		h["Upgrade"] = []string{up}
	}
	// The guest's 100-continue is answered when its body is first read.
	delete(h, "Expect")
	return nil
}

// exchange sends out on the tunnel's upstream connection, dialling it first when there is none
// (or the kept one was closed by the host). A kept connection found closed before any answer is
// replaced once for a request that can safely be sent again.
func (p *Proxy) exchange(ctx context.Context, sess *session, out *http.Request) (*http.Response, error) {
	if up := sess.up.Load(); up != nil && up.closedByHost() {
		sess.dropUpstream()
	}
	for attempt := 0; ; attempt++ {
		up := sess.up.Load()
		reused := up != nil
		if !reused {
			var err error
			if up, err = p.dialer.dial(ctx, sess); err != nil {
				return nil, err
			}
			sess.up.Store(up)
			if ctx.Err() != nil { // the guest left while the connection was being made
				sess.dropUpstream()
				return nil, context.Cause(ctx)
			}
		}
		resp, err := up.roundTrip(out, sess.addr)
		if err == nil {
			return resp, nil
		}
		sess.dropUpstream()
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if !reused || attempt > 0 || !errors.Is(err, errStale) || !replayable(out) {
			return nil, err
		}
	}
}

// relay writes the host's answer to the guest. A body of unknown length (chunked, server-sent
// events) is sent chunked and flushed as it arrives; one that breaks off breaks off the guest's
// connection too, so a cut answer is never taken for a whole one. It reports whether the tunnel
// goes on.
func (p *Proxy) relay(t *tunnel, req *http.Request, rs *reqState, resp *http.Response) bool {
	sess := rs.sess
	h := resp.Header
	removeHopHeaders(h)
	noBody := req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
	f := noFraming
	switch {
	case noBody:
	case resp.ContentLength >= 0:
		f.length = resp.ContentLength
	case req.ProtoAtLeast(1, 1):
		f.chunked, f.trailer = true, resp.Trailer
	default: // an HTTP/1.0 guest: the end of the body is the end of the connection
		f.close = true
	}
	t.writeHead(resp.StatusCode, h, f)
	var n int64
	var err error
	switch {
	case noBody:
		err = t.bw.Flush()
	case f.chunked:
		n, err = copyChunked(t.bw, resp.Body, resp.Trailer)
	default:
		buf := copyBufferPool.Get().(*[]byte)
		n, err = io.CopyBuffer(t.bw, onlyReader{resp.Body}, *buf)
		copyBufferPool.Put(buf)
		if err == nil {
			err = t.bw.Flush()
		}
	}
	resp.Body.Close()
	if err != nil || resp.Close {
		sess.dropUpstream()
	} else if up := sess.up.Load(); up != nil {
		up.used = time.Now()
	}
	p.emitRequest(rs, resp.StatusCode, n, audit.Allow, rs.allowRule(), "")
	return err == nil && !f.close
}

// copyChunked sends body as chunks, each flushed to the guest as it arrives, then the trailers.
func copyChunked(bw *bufio.Writer, body io.Reader, trailer http.Header) (int64, error) {
	buf := copyBufferPool.Get().(*[]byte)
	defer copyBufferPool.Put(buf)
	cw := httputil.NewChunkedWriter(bw)
	var n int64
	for {
		k, rerr := body.Read(*buf)
		if k > 0 {
			if _, err := cw.Write((*buf)[:k]); err != nil {
				return n, err
			}
			n += int64(k)
			if err := bw.Flush(); err != nil {
				return n, err
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return n, rerr
		}
	}
	if err := cw.Close(); err != nil {
		return n, err
	}
	for k, vv := range trailer {
		for _, v := range vv {
			if v != "" {
				fmt.Fprintf(bw, "%s: %s\r\n", k, v)
			}
		}
	}
	bw.WriteString("\r\n")
	return n, bw.Flush()
}

// switchProtocols relays a 101 and splices the guest's connection to the upstream one until
// either side closes.
func (p *Proxy) switchProtocols(t *tunnel, rs *reqState, resp *http.Response) {
	up := rs.sess.up.Swap(nil) // the upgraded connection belongs to the splice now
	p.emitRequest(rs, resp.StatusCode, 0, audit.Allow, rs.allowRule(), "")
	t.writeHead(resp.StatusCode, resp.Header, noFraming)
	if err := t.bw.Flush(); err != nil {
		up.close()
		return
	}
	var once sync.Once
	closeBoth := func() { once.Do(func() { t.conn.Close(); up.close() }) }
	go func() {
		io.Copy(up.conn, t.br) // the guest's bytes, including any already buffered
		closeBoth()
	}()
	io.Copy(t.conn, up.br)
	closeBoth()
}

// upstreamFailed answers a request the host did not take with a 502 the agent can read instead
// of a silently closed connection.
func (p *Proxy) upstreamFailed(t *tunnel, rs *reqState, err error) {
	p.log.Warn().Str(logKeySandbox, rs.sess.sb.ID).Str(logKeyHost, rs.sess.host).Str("error", redactHex64(err.Error())).Msg("upstream request failed")
	reason := fmt.Sprintf("nexus: upstream %s did not answer (%s)", rs.sess.host, upstreamErrorClass(err))
	t.writeLine(http.StatusBadGateway, reason, true)
	p.emitRequest(rs, http.StatusBadGateway, 0, audit.Allow, RuleUpstreamError, reason)
}

// onlyReader hides a body's WriterTo so io.CopyBuffer uses the pooled buffer.
type onlyReader struct{ io.Reader }

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
