package mitm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/netaddr"
	"github.com/IniZio/nexus/services/mitm/internal/http1"
)

// forward sends an allowed request over the tunnel's upstream connection and relays the answer:
// streamed both ways, trailers kept, a 101 spliced. The audit event is emitted once the answer's
// body has been relayed (at once for a protocol switch, whose spliced bytes are not counted). It
// reports whether the tunnel goes on.
func (p *Proxy) forward(t *tunnel, rs *reqState) bool {
	resp := &t.resp
	if err := p.exchange(p.ctx, rs, resp); err != nil {
		if pe := (*placeholderError)(nil); errors.As(err, &pe) {
			t.refuse(rs, placeholderVerdict(pe.rule, rs.sess.host))
			return false
		}
		if errors.Is(err, netaddr.ErrPrivate) {
			t.refuse(rs, &verdict{status: http.StatusForbidden, rule: netaddr.Rule, reason: "nexus: refused: upstream " + rs.sess.host + ": " + err.Error()})
			return false
		}
		p.upstreamFailed(t, rs, err)
		return false
	}
	if resp.Status == http.StatusSwitchingProtocols {
		p.switchProtocols(t, rs, resp)
		return false
	}
	return p.relay(t, rs, resp)
}

// exchange sends the request on the tunnel's upstream connection, dialling it first when there
// is none (or the kept one was closed by the host), and reads the answer's head into resp. A
// kept connection found closed before any answer is replaced once for a request that can safely
// be sent again.
func (p *Proxy) exchange(ctx context.Context, rs *reqState, resp *http1.Response) error {
	sess := rs.sess
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
		err := up.roundTrip(rs.req, rs.rewrite, resp)
		if err == nil {
			return nil
		}
		sess.dropUpstream()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if !reused || attempt > 0 || !errors.Is(err, errStale) || !replayable(rs.req) {
			return err
		}
	}
}

// relay writes the host's answer to the guest. A body of unknown length (chunked, server-sent
// events) is sent chunked and flushed as it arrives; one that breaks off breaks off the guest's
// connection too, so a cut answer is never taken for a whole one. It reports whether the tunnel
// goes on.
func (p *Proxy) relay(t *tunnel, rs *reqState, resp *http1.Response) bool {
	sess := rs.sess
	f := http1.NoBody
	switch {
	case resp.NoBody:
	case resp.Framing.Length >= 0:
		f.Length = resp.Framing.Length
	case rs.req.Minor >= 1:
		f.Chunked = true
	default: // an HTTP/1.0 guest: the end of the body is the end of the connection
		f.Close = true
	}
	http1.WriteResponseHead(t.bw, resp, f)
	var n int64
	var err error
	if resp.Body == nil {
		err = t.bw.Flush()
	} else {
		n, err = http1.CopyBody(t.bw, resp.Body, f, resp.Chunks)
	}
	if err != nil || resp.Close {
		sess.dropUpstream()
	} else if up := sess.up.Load(); up != nil {
		up.used = time.Now()
	}
	p.emitRequest(rs, resp.Status, n, audit.Allow, rs.allowRule(), "")
	return err == nil && !f.Close
}

// switchProtocols relays a 101 and splices the guest's connection to the upstream one until
// either side closes.
func (p *Proxy) switchProtocols(t *tunnel, rs *reqState, resp *http1.Response) {
	up := rs.sess.up.Swap(nil) // the upgraded connection belongs to the splice now
	p.emitRequest(rs, resp.Status, 0, audit.Allow, rs.allowRule(), "")
	http1.WriteSwitchHead(t.bw, resp)
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
	p.log.Warn().Str(logKeySandbox, rs.sess.sb.ID).Str(logKeyHost, rs.sess.host).Str("error", errText(err)).Msg("upstream request failed")
	reason := fmt.Sprintf("nexus: upstream %s did not answer (%s)", rs.sess.host, upstreamErrorClass(err))
	t.writeLine(http.StatusBadGateway, reason, true)
	p.emitRequest(rs, http.StatusBadGateway, 0, audit.Allow, RuleUpstreamError, reason)
}
