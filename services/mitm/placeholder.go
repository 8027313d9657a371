package mitm

import (
	"encoding/base64"
	"net/http"
	"strings"
)

// placeholderLen is the length of a credbroker placeholder: 32 random bytes in hex.
const placeholderLen = 64

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// eachHex64 calls fn for every run of exactly 64 hex digits in s (bounded by non-hex bytes or
// the ends of s) until fn returns false. Placeholders are such runs; scanning for them is cheap
// because most header values are short or not hex.
func eachHex64(s string, fn func(tok string) bool) {
	if len(s) < placeholderLen {
		return
	}
	start := -1
	for i := 0; i <= len(s); i++ {
		if i < len(s) && isHex(s[i]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			if i-start == placeholderLen && !fn(s[start:i]) {
				return
			}
			start = -1
		}
	}
}

// placeholderUse is what a request carries of this sandbox's placeholders.
type placeholderUse struct {
	// leak is set when a placeholder not bound to the request's host appears anywhere.
	leak bool
	// bearer is the Authorization placeholder bound to the host, to be swapped.
	bearer string
	// basicUser/basicPass: a Basic credential whose password is a placeholder bound to the
	// host (git over HTTPS); the password is swapped.
	basicUser, basicPass string
	// found is set when any placeholder of this sandbox appears anywhere.
	found bool
}

// scanPlaceholders looks for this sandbox's placeholders in every header (names and values) and
// the URL of r. Only placeholders in candidate positions are hashed, so the cost for ordinary
// traffic is one byte scan.
func scanPlaceholders(sb *Sandbox, r *http.Request, host string) placeholderUse {
	var u placeholderUse
	check := func(s string) {
		eachHex64(s, func(tok string) bool {
			hosts, ok := sb.placeholder(tok)
			if !ok {
				return true
			}
			u.found = true
			if !hosts.Match(host) {
				u.leak = true
				return false
			}
			return true
		})
	}
	if len(sb.creds) == 0 {
		return u
	}
	for k, vs := range r.Header {
		check(k)
		for _, v := range vs {
			check(v)
		}
		if u.leak {
			return u
		}
	}
	for _, vs := range r.Trailer {
		for _, v := range vs {
			check(v)
		}
	}
	if r.URL != nil {
		check(r.URL.Path)
		check(r.URL.RawPath)
		check(r.URL.RawQuery)
		check(r.URL.Fragment)
		if r.URL.User != nil {
			check(r.URL.User.String())
		}
	}
	check(r.RequestURI)
	// Basic credentials hide a placeholder in base64 (git sends the token as a password).
	for _, k := range []string{"Authorization", "Proxy-Authorization"} {
		for _, v := range r.Header.Values(k) {
			if user, pass, ok := basicAuth(v); ok {
				check(user)
				check(pass)
			}
		}
	}
	if u.leak {
		return u
	}
	auth := r.Header.Get("Authorization")
	if tok, ok := bearerToken(auth); ok && len(tok) == placeholderLen {
		if hosts, ok := sb.placeholder(tok); ok && hosts.Match(host) {
			u.bearer = tok
		}
	} else if user, pass, ok := basicAuth(auth); ok && len(pass) == placeholderLen {
		if hosts, ok := sb.placeholder(pass); ok && hosts.Match(host) {
			u.basicUser, u.basicPass = user, pass
		}
	}
	return u
}

// basicAuth decodes "Basic base64(user:pass)".
func basicAuth(h string) (user, pass string, ok bool) {
	scheme, enc, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "basic") || len(enc) > 4096 {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", "", false
	}
	user, pass, ok = strings.Cut(string(b), ":")
	if !ok {
		return "", "", false
	}
	return user, pass, true
}

// bearerToken extracts the token of "Bearer <token>" (scheme case-insensitive).
func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// redactPlaceholders replaces this sandbox's placeholders in s (for audit paths).
func redactPlaceholders(sb *Sandbox, s string) string {
	if len(sb.creds) == 0 || len(s) < placeholderLen {
		return s
	}
	var toks []string
	eachHex64(s, func(tok string) bool {
		if _, ok := sb.placeholder(tok); ok {
			toks = append(toks, tok)
		}
		return true
	})
	for _, t := range toks {
		s = strings.ReplaceAll(s, t, "[placeholder]")
	}
	return s
}

// redactHex64 replaces every 64-hex run in s: for log lines from code we do not control.
func redactHex64(s string) string {
	if len(s) < placeholderLen {
		return s
	}
	var toks []string
	eachHex64(s, func(tok string) bool { toks = append(toks, tok); return true })
	for _, t := range toks {
		s = strings.ReplaceAll(s, t, "[redacted]")
	}
	return s
}
