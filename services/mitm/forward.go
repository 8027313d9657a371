package mitm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/IniZio/nexus/pkg/audit"
)

// forward sends an allowed request over the tunnel's upstream connection and relays the answer:
// streamed both ways, trailers kept, a 101 spliced. The audit event is emitted once the answer's
// body has been relayed (at once for a protocol switch, whose spliced bytes are not counted).
func (p *Proxy) forward(w http.ResponseWriter, req *http.Request, rs *reqState) {
	out, err := outbound(req, rs.sess)
	if err != nil {
		p.refuse(w, req, rs, http.StatusBadRequest, RuleBadRequest, "nexus: refused: "+err.Error())
		return
	}
	// The guest going away (or the proxy closing) ends the wait for the host and the relay.
	stop := context.AfterFunc(req.Context(), rs.sess.dropUpstream)
	defer stop()
	resp, err := p.exchange(req.Context(), rs.sess, out)
	if err != nil {
		p.upstreamFailed(w, req, rs, err)
		return
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		p.switchProtocols(w, rs, resp)
		return
	}
	p.relay(w, rs, resp)
}

// outbound is the request as the host receives it: sent to the tunnel's own host whatever the
// request line says, without the headers of the guest's hop, and otherwise as the guest wrote it
// (its query, its forwarding headers; no User-Agent or Accept-Encoding of ours).
func outbound(req *http.Request, sess *session) (*http.Request, error) {
	out := new(http.Request)
	*out = *req
	out.Header = req.Header.Clone()
	u := *req.URL
	u.Scheme, u.Host = sess.scheme, sess.addr
	out.URL = &u
	out.RequestURI = ""
	out.Close = false
	up := upgradeType(req.Header)
	if !printable(up) {
		return nil, fmt.Errorf("invalid Upgrade protocol")
	}
	removeHopHeaders(out.Header)
	if strings.Contains(strings.ToLower(strings.Join(req.Header["Te"], ",")), "trailers") {
		out.Header.Set("Te", "trailers")
	}
	if up != "" {
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", up)
	}
	// The inner server answered the guest's 100-continue when the body was first read.
	out.Header.Del("Expect")
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = []string{""}
	}
	if req.ContentLength == 0 {
		out.Body = nil
	}
	return out, nil
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
		resp, err := up.roundTrip(out)
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
// events) is flushed as it arrives; one that breaks off breaks off the guest's connection too, so
// a cut answer is never taken for a whole one.
func (p *Proxy) relay(w http.ResponseWriter, rs *reqState, resp *http.Response) {
	sess := rs.sess
	h := w.Header()
	for k, vv := range resp.Header {
		h[k] = vv
	}
	removeHopHeaders(h)
	for k := range resp.Trailer {
		h.Add("Trailer", k)
	}
	w.WriteHeader(resp.StatusCode)

	var dst io.Writer = w
	if resp.ContentLength < 0 {
		dst = flushWriter{w: w, rc: http.NewResponseController(w)}
	}
	buf := copyBufferPool.Get().(*[]byte)
	n, err := io.CopyBuffer(dst, onlyReader{resp.Body}, *buf)
	copyBufferPool.Put(buf)
	resp.Body.Close()
	for k, vv := range resp.Trailer {
		h[http.TrailerPrefix+k] = vv
	}
	if err != nil || resp.Close {
		sess.dropUpstream()
	} else if up := sess.up.Load(); up != nil {
		up.used = time.Now()
	}
	p.emitRequest(rs, resp.StatusCode, n, audit.Allow, rs.allowRule(), "")
	if err != nil {
		panic(http.ErrAbortHandler) // net/http closes the guest's connection without ending the body
	}
}

// switchProtocols relays a 101 and splices the guest's connection to the upstream one until
// either side closes.
func (p *Proxy) switchProtocols(w http.ResponseWriter, rs *reqState, resp *http.Response) {
	sess := rs.sess
	up := sess.up.Swap(nil) // the upgraded connection belongs to the splice now
	guest, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.close()
		p.emitRequest(rs, http.StatusBadGateway, 0, audit.Allow, RuleUpstreamError, "protocol switch failed")
		return
	}
	p.emitRequest(rs, resp.StatusCode, 0, audit.Allow, rs.allowRule(), "")
	fmt.Fprintf(brw, "HTTP/1.1 %d %s\r\n", resp.StatusCode, http.StatusText(resp.StatusCode))
	resp.Header.Write(brw)
	brw.WriteString("\r\n")
	if err := brw.Flush(); err != nil {
		guest.Close()
		up.close()
		return
	}
	var once sync.Once
	closeBoth := func() { once.Do(func() { guest.Close(); up.close() }) }
	go func() {
		io.Copy(up.conn, brw.Reader) // the guest's bytes, including any the server had buffered
		closeBoth()
	}()
	io.Copy(guest, up.br)
	closeBoth()
}

// upstreamFailed answers a request the host did not take with a 502 the agent can read instead
// of a silently closed connection.
func (p *Proxy) upstreamFailed(w http.ResponseWriter, req *http.Request, rs *reqState, err error) {
	if req.Context().Err() != nil {
		// The guest went away: nothing to answer, but the request stays on record.
		p.emitRequest(rs, 0, 0, audit.Allow, rs.allowRule(), "client closed the connection")
		return
	}
	p.log.Warn().Str(logKeySandbox, rs.sess.sb.ID).Str(logKeyHost, rs.sess.host).Str("error", redactHex64(err.Error())).Msg("upstream request failed")
	reason := fmt.Sprintf("nexus: upstream %s did not answer (%s)", rs.sess.host, upstreamErrorClass(err))
	w.Header().Set("Connection", "close")
	writeLine(w, http.StatusBadGateway, reason)
	p.emitRequest(rs, http.StatusBadGateway, 0, audit.Allow, RuleUpstreamError, reason)
}

// flushWriter pushes every write to the guest at once.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// onlyReader hides a body's WriterTo so io.CopyBuffer uses the pooled buffer.
type onlyReader struct{ io.Reader }

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
