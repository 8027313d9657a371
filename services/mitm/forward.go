package mitm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	"github.com/IniZio/nexus/pkg/audit"
)

// forward sends an allowed request over the tunnel's upstream connection and relays the answer:
// streamed both ways, trailers kept, a 101 spliced. The audit event is emitted once the answer's
// body has been relayed (at once for a protocol switch, whose spliced bytes are not counted). It
// reports whether the tunnel goes on.
func (p *Proxy) forward(t *tunnel, req *request, rs *reqState) bool {
	resp := &t.resp
	if err := p.exchange(p.ctx, rs.sess, req, resp); err != nil {
		if errors.Is(err, errTrailerLeak) {
			t.refuse(req, rs, leakVerdict(rs.sess.host))
			return false
		}
		p.upstreamFailed(t, rs, err)
		return false
	}
	if resp.status == http.StatusSwitchingProtocols {
		p.switchProtocols(t, rs, resp)
		return false
	}
	return p.relay(t, req, rs, resp)
}

// exchange sends req on the tunnel's upstream connection, dialling it first when there is none
// (or the kept one was closed by the host), and reads the answer's head into resp. A kept
// connection found closed before any answer is replaced once for a request that can safely be
// sent again.
func (p *Proxy) exchange(ctx context.Context, sess *session, req *request, resp *response) error {
	if up := sess.up.Load(); up != nil && up.closedByHost() {
		sess.dropUpstream()
	}
	for attempt := 0; ; attempt++ {
		up := sess.up.Load()
		reused := up != nil
		if !reused {
			var err error
			if up, err = p.dialer.dial(ctx, sess); err != nil {
				return err
			}
			sess.up.Store(up)
			if ctx.Err() != nil { // the guest left while the connection was being made
				sess.dropUpstream()
				return context.Cause(ctx)
			}
		}
		err := up.roundTrip(req, resp, sess)
		if err == nil {
			return nil
		}
		sess.dropUpstream()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if !reused || attempt > 0 || !errors.Is(err, errStale) || !replayable(req) {
			return err
		}
	}
}

// relay writes the host's answer to the guest. A body of unknown length (chunked, server-sent
// events) is sent chunked and flushed as it arrives; one that breaks off breaks off the guest's
// connection too, so a cut answer is never taken for a whole one. It reports whether the tunnel
// goes on.
func (p *Proxy) relay(t *tunnel, req *request, rs *reqState, resp *response) bool {
	sess := rs.sess
	f := noFraming
	switch {
	case resp.noBody:
	case resp.frame.length >= 0:
		f.length = resp.frame.length
	case req.minor >= 1:
		f.chunked = true
	default: // an HTTP/1.0 guest: the end of the body is the end of the connection
		f.close = true
	}
	writeResponseHead(t.bw, resp, f)
	var n int64
	var err error
	switch {
	case resp.body == nil:
		err = t.bw.Flush()
	case f.chunked:
		var trailer *head
		if resp.chunk != nil {
			trailer = &resp.chunk.trailer
		}
		n, err = copyChunked(t.bw, resp.body, trailer)
	default:
		buf := copyBufferPool.Get().(*[]byte)
		n, err = io.CopyBuffer(t.bw, onlyReader{resp.body}, *buf)
		copyBufferPool.Put(buf)
		if err == nil {
			err = t.bw.Flush()
		}
	}
	if err != nil || resp.close {
		sess.dropUpstream()
	} else if up := sess.up.Load(); up != nil {
		up.used = time.Now()
	}
	p.emitRequest(rs, resp.status, n, audit.Allow, rs.allowRule(), "")
	return err == nil && !f.close
}

// copyChunked sends body as chunks, each flushed to the peer as it arrives, then the trailer
// fields (read once the body has ended; nil for none).
func copyChunked(bw *bufio.Writer, body io.Reader, trailer *head) (int64, error) {
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
	if trailer != nil {
		for _, f := range trailer.fields {
			if len(f.value) > 0 {
				writeFieldBytes(bw, f.name, f.value)
			}
		}
	}
	bw.WriteString("\r\n")
	return n, bw.Flush()
}

// switchProtocols relays a 101 and splices the guest's connection to the upstream one until
// either side closes.
func (p *Proxy) switchProtocols(t *tunnel, rs *reqState, resp *response) {
	up := rs.sess.up.Swap(nil) // the upgraded connection belongs to the splice now
	p.emitRequest(rs, resp.status, 0, audit.Allow, rs.allowRule(), "")
	writeSwitchHead(t.bw, resp)
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
