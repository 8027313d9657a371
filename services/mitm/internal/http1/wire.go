package http1

import (
	"bufio"
	"net/http"
	"strconv"
)

// Writing heads. A forwarded head is the sender's fields as they came (names and values were
// checked when read: no control bytes, so nothing written here can split a head), less the
// hop-by-hop ones, with the framing the writer chose for the body it sends. A value the caller
// puts in (Rewrite.Authorization) must pass ValidFieldValue first.

// Rewrite is what WriteRequest changes of the request it forwards.
type Rewrite struct {
	// DefaultHost is sent as the Host field of a request that has none and names no host in its
	// target (HTTP/1.0).
	DefaultHost string
	// Authorization, when set, is sent instead of the request's Authorization field (a request
	// without one gets none); DropAuthorization sends none.
	Authorization     string
	DropAuthorization bool
	// CredentialHeader, when set, names the field Authorization and DropAuthorization act on
	// instead of Authorization (a credential bound to x-api-key).
	CredentialHeader string
}

// WriteRequest writes req as a server receives it from the proxy: its method and target, its
// fields less its hop's (as rw says), then its body, framed by its length or sent chunked and
// flushed chunk by chunk. The caller flushes the head of a request without a body.
func WriteRequest(bw *bufio.Writer, req *Request, rw Rewrite) error {
	bw.WriteString(req.Method)
	bw.WriteByte(' ')
	bw.WriteString(requestTarget(req))
	bw.WriteString(" HTTP/1.1\r\n")
	hasHost, authDone := false, false
	replaceAuth := rw.DropAuthorization || rw.Authorization != ""
	authField := "Authorization"
	if rw.CredentialHeader != "" {
		authField = rw.CredentialHeader
	}
	chunked := req.Body != nil && req.Framing.Chunked
	for _, f := range req.Fields {
		switch {
		case f.Is("Trailer"):
			if chunked {
				writeFieldBytes(bw, f.Name, f.Value)
			}
			continue
		case req.hopField(f):
			continue
		case f.Is("Host"):
			hasHost = true
		case replaceAuth && f.Is(authField):
			if !authDone && !rw.DropAuthorization {
				writeField(bw, authField, rw.Authorization)
			}
			authDone = true
			continue
		}
		writeFieldBytes(bw, f.Name, f.Value)
	}
	if !hasHost {
		host := req.URL.Host
		if host == "" {
			host = rw.DefaultHost
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
	case req.Body != nil:
		writeLength(bw, req.Framing.Length)
	case req.Framing.Length == 0 || sendsZeroLength(req.Method):
		writeLength(bw, 0)
	}
	if _, err := bw.WriteString("\r\n"); err != nil || req.Body == nil {
		return err
	}
	_, err := CopyBody(bw, req.Body, req.Framing, req.Chunks)
	return err
}

// requestTarget is the request line's target as the client wrote it when it was in origin form
// (the common case: nothing to rebuild), else the path and query of the URL it named.
func requestTarget(req *Request) string {
	if u := req.Target; u[0] == '/' || u == "*" {
		return u
	}
	return req.URL.RequestURI()
}

// sendsZeroLength: methods whose servers expect a length even without a body.
func sendsZeroLength(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		return true
	}
	return false
}

// WriteResponseHead writes the server's answer's status line and fields, less the hop-by-hop
// ones, and the framing f the relay chose (buffered: the caller flushes or writes the body).
func WriteResponseHead(bw *bufio.Writer, resp *Response, f Framing) {
	writeStatusLine(bw, resp.Status, resp.Reason)
	for _, fl := range resp.Fields {
		switch {
		case fl.Is("Trailer"):
			if f.Chunked {
				writeFieldBytes(bw, fl.Name, fl.Value)
			}
			continue
		case fl.Is("Content-Length"):
			// An answer without a body keeps the length the server gave (HEAD, 304).
			if resp.NoBody {
				writeFieldBytes(bw, fl.Name, fl.Value)
			}
			continue
		case resp.hopField(fl):
			continue
		}
		writeFieldBytes(bw, fl.Name, fl.Value)
	}
	switch {
	case f.Length >= 0:
		writeLength(bw, f.Length)
	case f.Chunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case f.Close:
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

// WriteSwitchHead writes a 101 answer as the server sent it: its Connection and Upgrade fields
// are the point of it (buffered).
func WriteSwitchHead(bw *bufio.Writer, resp *Response) {
	writeStatusLine(bw, resp.Status, resp.Reason)
	for _, f := range resp.Fields {
		writeFieldBytes(bw, f.Name, f.Value)
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

// writeStatusLine writes "HTTP/1.1 <status> <reason>": the server's reason phrase, or the
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
