package mitm

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// Writing heads. net/http's parsers read both sides of a tunnel; the heads the proxy sends on are
// written here, straight from the parsed header maps: no copy of the request, no sorting, no
// formatting. Every header name and value written came through net/http's parser, which refuses
// control bytes, or is one the proxy set itself from checked values (see validFieldValue for the
// swapped credential), so nothing written here can split a head.

// writeRequest writes req as the host receives it: the guest's request target and Host, its
// headers (the guest's hop headers already removed), then its body, framed by its length or sent
// chunked and flushed chunk by chunk. The caller flushes.
func writeRequest(bw *bufio.Writer, req *http.Request, host string) error {
	if req.Host != "" {
		host = req.Host
	}
	bw.WriteString(req.Method)
	bw.WriteByte(' ')
	bw.WriteString(requestTarget(req))
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	writeFields(bw, req.Header, true)
	hasBody := req.Body != nil && req.Body != http.NoBody && req.ContentLength != 0
	chunked := hasBody && req.ContentLength < 0
	switch {
	case chunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
		for k := range req.Trailer {
			writeField(bw, "Trailer", k)
		}
	case hasBody:
		writeLength(bw, req.ContentLength)
	case sendsZeroLength(req):
		writeLength(bw, 0)
	}
	_, err := bw.WriteString("\r\n")
	if err != nil || !hasBody {
		return err
	}
	if chunked {
		_, err := copyChunked(bw, req.Body, req.Trailer)
		return err
	}
	buf := copyBufferPool.Get().(*[]byte)
	n, err := io.CopyBuffer(bw, onlyReader{req.Body}, *buf)
	copyBufferPool.Put(buf)
	if err == nil && n != req.ContentLength {
		err = fmt.Errorf("request body of %d bytes, %d declared", n, req.ContentLength)
	}
	return err
}

// requestTarget is the request line's target as the guest wrote it when it was in origin form
// (the common case: nothing to rebuild), else the path and query of the URL it named.
func requestTarget(req *http.Request) string {
	if u := req.RequestURI; u != "" && (u[0] == '/' || u == "*") {
		return u
	}
	return req.URL.RequestURI()
}

// sendsZeroLength: a request without a body still says Content-Length: 0 when the guest said
// so, and for the methods whose servers expect a length.
func sendsZeroLength(req *http.Request) bool {
	if _, ok := req.Header["Content-Length"]; ok {
		return true
	}
	switch req.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		return true
	}
	return false
}

// writeFields writes the fields of h, leaving out the framing ones (Content-Length,
// Transfer-Encoding, Trailer), which the writer decides, and Host when framing a request.
func writeFields(bw *bufio.Writer, h http.Header, request bool) {
	for k, vv := range h {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		case "Host":
			if request {
				continue
			}
		}
		for _, v := range vv {
			writeField(bw, k, v)
		}
	}
}

func writeField(bw *bufio.Writer, k, v string) {
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(v)
	bw.WriteString("\r\n")
}

func writeLength(bw *bufio.Writer, n int64) {
	var b [20]byte
	bw.WriteString("Content-Length: ")
	bw.Write(strconv.AppendInt(b[:0], n, 10))
	bw.WriteString("\r\n")
}

// writeStatusLine writes "HTTP/1.1 <status> <text>".
func writeStatusLine(bw *bufio.Writer, status int) {
	var b [3]byte
	bw.WriteString("HTTP/1.1 ")
	bw.Write(strconv.AppendInt(b[:0], int64(status), 10))
	bw.WriteByte(' ')
	if text := http.StatusText(status); text != "" {
		bw.WriteString(text)
	} else {
		bw.WriteString("status")
	}
	bw.WriteString("\r\n")
}

// validFieldValue reports whether s may be sent as a header value: visible characters, spaces and
// tabs only. A credential that is not (a stored secret with a line break) is never sent.
func validFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
