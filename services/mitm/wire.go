package mitm

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// Writing heads. A forwarded head is the sender's fields as they came (names and values were
// checked when read: no control bytes, so nothing written here can split a head), less the
// hop-by-hop ones, with the framing the proxy chose for the body it sends. The one value the
// proxy puts in, the swapped credential, is checked by validFieldValue before it is used.

// writeRequest writes req as the host receives it: the guest's method and target, its fields
// less its hop's (the Authorization swapped or dropped as judged), then its body, framed by its
// length or sent chunked and flushed chunk by chunk. The caller flushes.
func writeRequest(bw *bufio.Writer, req *request, sess *session) error {
	bw.WriteString(req.method)
	bw.WriteByte(' ')
	bw.WriteString(requestTarget(req))
	bw.WriteString(" HTTP/1.1\r\n")
	hasHost, authDone := false, false
	chunked := req.body != nil && req.frame.chunked
	for _, f := range req.fields {
		switch {
		case f.is("Trailer"):
			if chunked {
				writeFieldBytes(bw, f.name, f.value)
			}
			continue
		case req.hopField(f):
			continue
		case f.is("Host"):
			hasHost = true
		case f.is("Authorization") && (req.stripAuth || req.auth != ""):
			if !authDone && !req.stripAuth {
				writeField(bw, "Authorization", req.auth)
			}
			authDone = true
			continue
		}
		writeFieldBytes(bw, f.name, f.value)
	}
	if !hasHost {
		host := req.url.Host
		if host == "" {
			host = sess.addr
		}
		writeField(bw, "Host", host)
	}
	if req.teTrailers {
		bw.WriteString("Te: trailers\r\n")
	}
	if req.upgrade != "" {
		bw.WriteString("Connection: Upgrade\r\n")
		writeField(bw, "Upgrade", req.upgrade)
	}
	switch {
	case chunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case req.body != nil:
		writeLength(bw, req.frame.length)
	case req.frame.length == 0 || sendsZeroLength(req.method):
		writeLength(bw, 0)
	}
	if _, err := bw.WriteString("\r\n"); err != nil || req.body == nil {
		return err
	}
	if chunked {
		_, err := copyChunked(bw, req.body, &req.chunk.trailer)
		return err
	}
	buf := copyBufferPool.Get().(*[]byte)
	n, err := io.CopyBuffer(bw, onlyReader{req.body}, *buf)
	copyBufferPool.Put(buf)
	if err == nil && n != req.frame.length {
		err = fmt.Errorf("request body of %d bytes, %d declared", n, req.frame.length)
	}
	return err
}

// requestTarget is the request line's target as the guest wrote it when it was in origin form
// (the common case: nothing to rebuild), else the path and query of the URL it named.
func requestTarget(req *request) string {
	if u := req.target; u[0] == '/' || u == "*" {
		return u
	}
	return req.url.RequestURI()
}

// sendsZeroLength: methods whose servers expect a length even without a body.
func sendsZeroLength(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		return true
	}
	return false
}

// writeResponseHead writes the host's answer's status line and fields, less the hop-by-hop ones,
// and the framing the relay chose (buffered).
func writeResponseHead(bw *bufio.Writer, resp *response, f bodyFraming) {
	writeStatusLine(bw, resp.status, resp.reason)
	for _, fl := range resp.fields {
		switch {
		case fl.is("Trailer"):
			if f.chunked {
				writeFieldBytes(bw, fl.name, fl.value)
			}
			continue
		case fl.is("Content-Length"):
			// An answer without a body keeps the length the host gave (HEAD, 304).
			if resp.noBody {
				writeFieldBytes(bw, fl.name, fl.value)
			}
			continue
		case resp.hopField(fl):
			continue
		}
		writeFieldBytes(bw, fl.name, fl.value)
	}
	switch {
	case f.length >= 0:
		writeLength(bw, f.length)
	case f.chunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case f.close:
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

// writeSwitchHead writes a 101 answer as the host sent it: its Connection and Upgrade fields are
// the point of it.
func writeSwitchHead(bw *bufio.Writer, resp *response) {
	writeStatusLine(bw, resp.status, resp.reason)
	for _, f := range resp.fields {
		writeFieldBytes(bw, f.name, f.value)
	}
	bw.WriteString("\r\n")
}

func writeField(bw *bufio.Writer, k, v string) {
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(v)
	bw.WriteString("\r\n")
}

func writeFieldBytes(bw *bufio.Writer, k, v []byte) {
	bw.Write(k)
	bw.WriteString(": ")
	bw.Write(v)
	bw.WriteString("\r\n")
}

func writeLength(bw *bufio.Writer, n int64) {
	bw.WriteString("Content-Length: ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), n, 10))
	bw.WriteString("\r\n")
}

// writeStatusLine writes "HTTP/1.1 <status> <reason>": the host's reason phrase, or the
// standard one when it gave none.
func writeStatusLine(bw *bufio.Writer, status int, reason []byte) {
	bw.WriteString("HTTP/1.1 ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(status), 10))
	bw.WriteByte(' ')
	switch {
	case len(reason) > 0:
		bw.Write(reason)
	case http.StatusText(status) != "":
		bw.WriteString(http.StatusText(status))
	default:
		bw.WriteString("status")
	}
	bw.WriteString("\r\n")
}

// validFieldValue reports whether s may be sent as a header value: visible characters, spaces and
// tabs only. A credential that is not (a stored secret with a line break) is never sent.
func validFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isValueByte(s[i]) {
			return false
		}
	}
	return true
}
