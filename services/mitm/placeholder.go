package mitm

import (
	"bytes"
	"encoding/base64"
	"slices"
	"strings"
	"unsafe"

	"github.com/IniZio/nexus/services/mitm/internal/http1"
)

// placeholderLen is the length of a credbroker placeholder: 32 random bytes in hex.
const placeholderLen = 64

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// eachHex64 calls fn for every run of exactly 64 hex digits in s (bounded by non-hex bytes or
// the ends of s) until fn returns false. Placeholders are such runs; scanning for them is cheap
// because most header values are short or not hex.
func eachHex64[T ~string | ~[]byte](s T, fn func(tok T) bool) {
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
	// bearer is the placeholder bound to the host found in its credential position, to be
	// swapped: the token of "Bearer <p>" or "token <p>" (what gh sends) in Authorization, with
	// its scheme, or the whole value of the header its binding names (header,
	// lower case: x-api-key).
	bearer, scheme, header string
	// basicUser/basicPass: a Basic credential whose password is a placeholder bound to the
	// host (git over HTTPS); the password is swapped.
	basicUser, basicPass string
	// found is set when any placeholder of this sandbox appears anywhere.
	found bool
}

// scanPlaceholders looks for this sandbox's placeholders in every field (names and values) and
// the target of r, in each form f knows (scan.go). Only candidates are hashed, so the cost for
// ordinary traffic is one byte scan.
func scanPlaceholders(f *forms, sb *Sandbox, r *http1.Request, host string) placeholderUse {
	var u placeholderUse
	if len(sb.creds) == 0 {
		return u
	}
	// bound notes a placeholder of this sandbox; false (stop) once one is bound elsewhere.
	bound := func(hosts HostSet, ok bool) bool {
		if !ok {
			return true
		}
		u.found = true
		if !hosts.Match(host) {
			u.leak = true
			return false
		}
		return true
	}
	checkBytes := func(b []byte) {
		f.each(b, func(tok []byte) bool { return bound(sb.placeholderBytes(tok)) })
	}
	check := func(s string) { checkBytes(stringBytes(s)) }
	var auth, bearer []byte
	for _, f := range r.Fields {
		checkBytes(f.Name)
		if auth == nil && f.Is("Authorization") {
			auth = f.Value
			// The common case, "Bearer <placeholder>" (or gh's "token <placeholder>"), is
			// looked up once.
			if scheme, tok, ok := authPlaceholder(f.Value); ok {
				hosts, found := sb.placeholderBytes(tok)
				if !bound(hosts, found) {
					return u
				}
				if found && bearer == nil && sb.credentialHeader(tok) == "" {
					bearer, u.scheme = tok, scheme
				}
				continue
			}
		}
		if bearer == nil && len(sb.credHeaders) > 0 && slices.ContainsFunc(sb.credHeaders, f.Is) {
			// A secret bound to a header (x-api-key) is swapped only as that header's whole value.
			if tok := bytes.Trim(f.Value, " \t"); len(tok) == placeholderLen {
				if hosts, found := sb.placeholderBytes(tok); found && hosts.Match(host) && f.Is(sb.credentialHeader(tok)) {
					bearer, u.header = tok, sb.credentialHeader(tok)
				}
			}
		}
		checkBytes(f.Value)
		if u.leak {
			return u
		}
		// Basic credentials hide a placeholder in base64 (git sends the token as a password).
		if f.Is("Authorization") || f.Is("Proxy-Authorization") {
			if user, pass, ok := basicAuth(string(f.Value)); ok {
				check(user)
				check(pass)
			}
		}
	}
	check(r.Target)
	check(r.URL.Path)
	if u.leak || auth == nil && bearer == nil {
		return u
	}
	if bearer != nil {
		u.bearer = string(bearer)
	} else if user, pass, ok := basicAuth(string(auth)); ok && len(pass) == placeholderLen {
		if hosts, ok := sb.placeholder(pass); ok && hosts.Match(host) && sb.credentialHeader([]byte(pass)) == "" {
			u.basicUser, u.basicPass = user, pass
		}
	}
	return u
}

// trailerRefusal is the refusal of trailer fields carrying a placeholder of sb they may not ("" for
// none): any on a cleartext leg, one bound elsewhere on a TLS one.
func trailerRefusal(f *forms, sb *Sandbox, tr *http1.Head, host string, cleartext bool) string {
	for _, fl := range tr.Fields {
		for _, b := range [2][]byte{fl.Name, fl.Value} {
			if rule := f.refusal(b, sb, host, cleartext); rule != "" {
				return rule
			}
		}
	}
	return ""
}

// stringBytes is s as a byte slice without a copy, for scans that only read it.
func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

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

// Authorization schemes a placeholder token is swapped under, as they are sent upstream.
const (
	schemeBearer = "Bearer"
	schemeToken  = "token" // the gh CLI's
)

// authPlaceholder extracts the scheme and token of "Bearer <64 hex digits>" or
// "token <64 hex digits>" (scheme in any case, spaces around the token allowed): the shapes of a
// placeholder in an Authorization value.
func authPlaceholder(v []byte) (scheme string, tok []byte, ok bool) {
	name, rest, found := bytes.Cut(v, []byte(" "))
	switch {
	case !found:
		return "", nil, false
	case bytes.EqualFold(name, []byte(schemeBearer)):
		scheme = schemeBearer
	case bytes.EqualFold(name, []byte(schemeToken)):
		scheme = schemeToken
	default:
		return "", nil, false
	}
	tok = bytes.Trim(rest, " \t")
	if len(tok) != placeholderLen {
		return "", nil, false
	}
	for _, c := range tok {
		if !isHex(c) {
			return "", nil, false
		}
	}
	return scheme, tok, true
}

// swappedCredential is what is forwarded in the placeholder's credential position once the real
// credential is known: the guest's own Authorization scheme with the real token (Bearer, token),
// Basic with the real password, or the real value as the whole of the bound header.
func (u *placeholderUse) swappedCredential(secret string) string {
	switch {
	case u.header != "":
		return secret
	case u.bearer != "":
		return u.scheme + " " + secret
	default:
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(u.basicUser+":"+secret))
	}
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
