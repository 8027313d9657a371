package mitm

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"strings"
	"testing"

	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/services/mitm/internal/http1"
)

// headerPlaceholder is bound to api.example.com in the x-api-key header.
const headerPlaceholder = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"

// forwardedHead judges raw as a request in a tunnel to api.example.com (TLS unless plain) and
// returns the head the mitm would send upstream, or the refusal.
func forwardedHead(t *testing.T, raw string, plain bool) (string, *verdict) {
	t.Helper()
	f := newJudgeFixture(t, nil)
	sb, err := NewSandbox(mitmapi.SandboxPolicy{
		ID: testSandbox, TokenHash: mitmapi.HashHex(testToken), AllowedHosts: []string{"api.example.com", "other.example.com"},
		Credentials: []mitmapi.CredentialBinding{
			{PlaceholderHash: mitmapi.HashHex(placeholder), Hosts: []string{"api.example.com"}},
			{PlaceholderHash: mitmapi.HashHex(headerPlaceholder), Hosts: []string{"api.example.com"}, Header: "x-api-key"},
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.sb = sb
	rs := f.state(t, "api.example.com", raw)
	if plain {
		rs.sess.scheme = "http"
	}
	if v := f.p.judge(rs); v != nil {
		return "", v
	}
	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	if err := http1.WriteRequest(bw, rs.req, rs.rewrite); err != nil {
		t.Fatal(err)
	}
	bw.Flush()
	return buf.String(), nil
}

// TestAuthorizationSchemes: the placeholder is swapped in the credential position under each
// scheme clients send it with — Bearer, gh's `token`, and Basic (git: base64 of
// user:placeholder) — and the scheme goes upstream as the client chose it.
func TestAuthorizationSchemes(t *testing.T) {
	basic := func(user, pass string) string { return base64.StdEncoding.EncodeToString([]byte(user + ":" + pass)) }
	for _, c := range []struct{ name, auth, want string }{
		{"Bearer", "Bearer " + placeholder, "Authorization: Bearer " + realToken},
		{"bearer in lower case", "bearer " + placeholder, "Authorization: Bearer " + realToken},
		{"gh token", "token " + placeholder, "Authorization: token " + realToken},
		{"Token in any case", "TOKEN  " + placeholder, "Authorization: token " + realToken},
		{"git Basic", "Basic " + basic("x-access-token", placeholder), "Authorization: Basic " + basic("x-access-token", realToken)},
	} {
		t.Run(c.name, func(t *testing.T) {
			head, v := forwardedHead(t, "GET /user HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: "+c.auth+"\r\n\r\n", false)
			if v != nil {
				t.Fatalf("refused: %+v", v)
			}
			if !strings.Contains(head, "\r\n"+c.want+"\r\n") || strings.Contains(head, placeholder) {
				t.Fatalf("forwarded head:\n%s\nwant %q", head, c.want)
			}
		})
	}
}

// TestHeaderSecret: a secret bound to x-api-key is swapped as that header's whole value (the
// Anthropic API key rail), and only there: in Authorization, or another header, its placeholder
// goes on as the placeholder. An Authorization secret in x-api-key is not swapped either.
func TestHeaderSecret(t *testing.T) {
	head, v := forwardedHead(t, "POST /v1/messages HTTP/1.1\r\nHost: api.example.com\r\nX-Api-Key: "+headerPlaceholder+"\r\nContent-Length: 0\r\n\r\n", false)
	if v != nil {
		t.Fatalf("refused: %+v", v)
	}
	if !strings.Contains(strings.ToLower(head), "\r\nx-api-key: "+strings.ToLower(realToken)+"\r\n") || strings.Contains(head, headerPlaceholder) {
		t.Fatalf("forwarded head:\n%s", head)
	}
	for _, raw := range []string{
		"GET / HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer " + headerPlaceholder + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: api.example.com\r\nX-Other: " + headerPlaceholder + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: api.example.com\r\nX-Api-Key: " + placeholder + "\r\n\r\n",
	} {
		head, v := forwardedHead(t, raw, false)
		if v != nil {
			t.Fatalf("refused: %+v", v)
		}
		if strings.Contains(head, realToken) {
			t.Errorf("swapped outside the credential position:\n%s", head)
		}
	}
}

// TestSwapOnlyInsideTLS: on a plain-HTTP tunnel the real credential is never put on the wire.
func TestSwapOnlyInsideTLS(t *testing.T) {
	for _, raw := range []string{
		"GET / HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer " + placeholder + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: token " + placeholder + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: api.example.com\r\nX-Api-Key: " + headerPlaceholder + "\r\n\r\n",
	} {
		head, v := forwardedHead(t, raw, true)
		if strings.Contains(head, realToken) {
			t.Errorf("real credential on a cleartext leg:\n%s", head)
		}
		_ = v // refused (placeholder_cleartext) or forwarded as the placeholder: never swapped
	}
}
