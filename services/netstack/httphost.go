package netstack

import (
	"bytes"
	"errors"
	"net"
	"strings"

	"github.com/IniZio/nexus/pkg/policy"
)

var (
	errNotHTTP    = errors.New("not an http/1 request")
	errNoHost     = errors.New("http request has no host header")
	errBadHost    = errors.New("http request has an invalid host")
	errHeadTooBig = errors.New("http request head too large")
)

// parseHTTPHost returns the host name (without port, lowercase) an HTTP/1.x request at the start
// of b is addressed to: its Host header, which must agree with an absolute-form request target.
// It returns errNeedMore while the head (up to the blank line) is incomplete.
func parseHTTPHost(b []byte) (string, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= maxHTTPHead {
			return "", errHeadTooBig
		}
		// Fail fast on something that cannot be a request line.
		if i := bytes.IndexByte(b, ' '); i < 0 && len(b) > 32 || i > 32 {
			return "", errNotHTTP
		}
		for _, c := range b[:min(len(b), 32)] {
			if c == ' ' {
				break
			}
			if c < 'A' || c > 'Z' {
				return "", errNotHTTP
			}
		}
		return "", errNeedMore
	}
	if end > maxHTTPHead {
		return "", errHeadTooBig
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	reqLine := strings.Split(lines[0], " ")
	if len(reqLine) != 3 || reqLine[0] == "" || !strings.HasPrefix(reqLine[2], "HTTP/1.") {
		return "", errNotHTTP
	}
	for _, c := range reqLine[0] {
		if c < 'A' || c > 'Z' {
			return "", errNotHTTP
		}
	}
	host := ""
	seen := false
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return "", errNotHTTP // also refuses obsolete line folding
		}
		if !strings.EqualFold(k, "host") {
			continue
		}
		if seen {
			return "", errBadHost // two Host headers: ambiguous, refuse
		}
		seen = true
		host = strings.Trim(v, " \t")
	}
	if !seen || host == "" {
		return "", errNoHost
	}
	h, err := hostOnly(host)
	if err != nil {
		return "", err
	}
	target := reqLine[1]
	if rest, ok := cutSchemePrefix(target); ok {
		authority, _, _ := strings.Cut(rest, "/")
		th, err := hostOnly(authority)
		if err != nil || th != h {
			return "", errBadHost
		}
	}
	return h, nil
}

func cutSchemePrefix(target string) (string, bool) {
	lower := strings.ToLower(target)
	for _, p := range []string{"http://", "https://"} {
		if strings.HasPrefix(lower, p) {
			return target[len(p):], true
		}
	}
	return "", false
}

// hostOnly strips an optional :port from an authority and normalizes the name.
func hostOnly(authority string) (string, error) {
	if strings.ContainsAny(authority, "@[]") {
		return "", errBadHost
	}
	h := authority
	if strings.Contains(authority, ":") {
		var port string
		var err error
		h, port, err = net.SplitHostPort(authority)
		if err != nil || port == "" {
			return "", errBadHost
		}
		for _, c := range port {
			if c < '0' || c > '9' {
				return "", errBadHost
			}
		}
	}
	n, err := policy.NormalizeHost(h)
	if err != nil {
		return "", errBadHost
	}
	return n, nil
}
