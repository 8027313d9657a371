package agentproto

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
)

// The channel handshake. Before the guest opens its virtio-serial port, bytes the host writes may
// be dropped or held; after a host reconnects, bytes of the previous session may still be in
// flight. So before yamux starts, the host writes Hello with a fresh nonce and waits (with a
// deadline) for Ready with the same nonce, skipping anything else; the agent skips everything until
// a Hello line. On a deadline the host reconnects and tries again with a new nonce.
const (
	helloPrefix = "NEXUS-AGENT-HELLO "
	readyPrefix = "NEXUS-AGENT-READY "
	maxLine     = 256
)

var nonceRE = regexp.MustCompile(`^[0-9a-f]{8,64}$`)

// Hello is the line the host writes to start a session.
func Hello(nonce string) []byte { return []byte(helloPrefix + nonce + "\n") }

// Ready is the agent's answer to Hello.
func Ready(nonce string) []byte { return []byte(readyPrefix + nonce + "\n") }

// AwaitHello reads lines from r until one is a valid Hello and returns its nonce. Other lines
// and garbage are skipped; over-long lines are skipped in bounded pieces.
func AwaitHello(r *bufio.Reader) (string, error) {
	for {
		line, err := readBoundedLine(r)
		if err != nil {
			return "", err
		}
		if nonce, ok := parseLine(line, helloPrefix); ok {
			return nonce, nil
		}
	}
}

// AwaitReady reads lines from r until it finds Ready for nonce. The caller bounds it with a
// deadline on the underlying connection.
func AwaitReady(r *bufio.Reader, nonce string) error {
	for {
		line, err := readBoundedLine(r)
		if err != nil {
			return fmt.Errorf("handshake: %w", err)
		}
		if got, ok := parseLine(line, readyPrefix); ok && got == nonce {
			return nil
		}
	}
}

func parseLine(line []byte, prefix string) (string, bool) {
	i := bytes.Index(line, []byte(prefix))
	if i < 0 {
		return "", false
	}
	nonce := string(line[i+len(prefix):])
	if !nonceRE.MatchString(nonce) {
		return "", false
	}
	return nonce, true
}

// readBoundedLine returns the next line without its newline; a line longer than maxLine is
// returned in pieces (none of which will parse as a handshake line).
func readBoundedLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		b, err := r.ReadByte()
		if err != nil {
			return nil, err
		}
		if b == '\n' {
			return line, nil
		}
		if len(line) >= maxLine {
			line = line[:0]
		}
		line = append(line, b)
	}
}

// ErrBadConnectLine is returned for a hybrid-vsock request line that is not "CONNECT <port>\n".
var ErrBadConnectLine = errors.New("bad CONNECT line")

// ReadConnectLine reads the hybrid-vsock request "CONNECT <port>\n" one byte at a time (so no
// byte after the newline is consumed), at most 32 bytes, and returns the port (1..65535).
func ReadConnectLine(r io.Reader) (int, error) {
	var buf [32]byte
	n := 0
	for {
		if n == len(buf) {
			return 0, ErrBadConnectLine
		}
		if _, err := io.ReadFull(r, buf[n:n+1]); err != nil {
			return 0, err
		}
		if buf[n] == '\n' {
			break
		}
		n++
	}
	line := buf[:n]
	const prefix = "CONNECT "
	if !bytes.HasPrefix(line, []byte(prefix)) {
		return 0, ErrBadConnectLine
	}
	digits := line[len(prefix):]
	if len(digits) == 0 || len(digits) > 5 {
		return 0, ErrBadConnectLine
	}
	port := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, ErrBadConnectLine
		}
		port = port*10 + int(c-'0')
	}
	if port < 1 || port > 65535 {
		return 0, ErrBadConnectLine
	}
	return port, nil
}

// ConnectOK is the reply to an accepted CONNECT line.
func ConnectOK(port int) []byte { return fmt.Appendf(nil, "OK %d\n", port) }
