package egress_test

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/audit"
)

// probeHTTP sends one request from the guest with the probe (testdata/probe/http.go), connecting
// to ip; url, body ("-" for none) and header values may hold {ENC:VAR} slots the guest fills in
// from its own variables. It returns the status and the X-Nexus-Deny line.
func probeHTTP(t *testing.T, box, ip, method, url, body string, headers ...string) (int, string) {
	t.Helper()
	args := []string{"probe", "http", ip, method, url, body}
	args = append(args, headers...)
	for i, a := range args {
		args[i] = "'" + a + "'"
	}
	out := mustSh(t, box, strings.Join(args, " "))
	var status int
	var deny string
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "status "); ok {
			fmt.Sscanf(v, "%d", &status)
		}
		if v, ok := strings.CutPrefix(l, "deny: "); ok {
			deny = v
		}
	}
	if status == 0 {
		t.Fatalf("probe http %s %s: %q", method, url, out)
	}
	return status, deny
}

// encodedForms are the encodings of v the probe sends, for the leak scan.
func encodedForms(v string) map[string]string {
	var pct, js strings.Builder
	for i := 0; i < len(v); i++ {
		fmt.Fprintf(&pct, "%%%02X", v[i])
		fmt.Fprintf(&js, `\u%04x`, v[i])
	}
	return map[string]string{
		"percent-encoded": pct.String(), "json-escaped": js.String(),
		"base64": base64.StdEncoding.EncodeToString([]byte(v)), "base64url": base64.RawURLEncoding.EncodeToString([]byte(v)),
	}
}

// TestPlaceholderLeaks: a placeholder travels only over TLS and only to the host it is bound
// to, wherever in the request and however encoded the guest puts it. On cleartext (port 80)
// even the bound host gets neither the real credential nor the placeholder
// (placeholder_cleartext); another host gets no placeholder in the body, a percent-encoded
// query or base64 (placeholder_leak); the bound host gets its placeholder outside the credential
// position as the placeholder, and the credential in it swapped.
func TestPlaceholderLeaks(t *testing.T) {
	real := randomToken("sk_leak_real_")
	setSecret(t, "LEAK_TOKEN", real)
	const box = "egress/leak"
	create(t, box, "nexus-mini", "--secret", "LEAK_TOKEN@api.anthropic.com,example.test", "--allow-host", "api.github.com")
	installProbe(t, box)
	env := placeholders(t, box, "NEXUS_CRED_API_ANTHROPIC_COM_TOKEN", "NEXUS_CRED_EXAMPLE_TEST_TOKEN")
	own := env["NEXUS_CRED_API_ANTHROPIC_COM_TOKEN"]
	for _, k := range []string{"NEXUS_CRED_API_ANTHROPIC_COM_TOKEN", "NEXUS_CRED_EXAMPLE_TEST_TOKEN"} {
		for enc, v := range encodedForms(env[k]) {
			secrets.add(enc+" placeholder "+k, v)
		}
	}
	anthIP := resolveMini(t, box, "api.anthropic.com")
	ghIP := resolveMini(t, box, "api.github.com")
	exIP := resolveMini(t, box, "example.test")

	t.Run("cleartext", func(t *testing.T) {
		for _, c := range []struct{ url, body, header string }{
			{"http://example.test/leak80?case=bearer", "-", "Authorization: Bearer {raw:NEXUS_CRED_EXAMPLE_TEST_TOKEN}"},
			{"http://example.test/leak80?case=body", `{"k": "{raw:NEXUS_CRED_EXAMPLE_TEST_TOKEN}"}`, "X-Case: body"},
		} {
			status, deny := probeHTTP(t, box, exIP, "POST", c.url, c.body, c.header)
			if status != 403 || !strings.Contains(deny, "nexus: refused: a nexus credential placeholder was sent to example.test over plain HTTP") {
				t.Errorf("%s: %d %q", c.url, status, deny)
			}
		}
		if got := upstreams[plainHost].find("/leak80"); len(got) != 0 {
			t.Fatalf("example.test got %d cleartext requests carrying the credential: first with Authorization real=%v",
				len(got), strings.Contains(got[0].Auth, real))
		}
		ev := waitEvent(t, box, true, "placeholder_cleartext", func(e audit.Event) bool {
			return e.Rule == "placeholder_cleartext" && e.Host == "example.test"
		})
		if ev.Port != 80 || ev.Status != 403 || ev.Swapped || ev.Layer != audit.LayerHTTP {
			t.Errorf("cleartext event: %+v", ev)
		}
		// Plain HTTP without a placeholder is not affected.
		if status, deny := probeHTTP(t, box, exIP, "GET", "http://example.test/plain80", "-"); status != 200 {
			t.Errorf("plain http: %d %q", status, deny)
		}
	})

	t.Run("another host", func(t *testing.T) {
		before := upstreams["api.github.com"].count()
		for _, c := range []struct {
			what, method, url, body string
			headers                 []string
		}{
			{"raw in the body", "POST", "https://api.github.com/gists?case=body", `{"files": {"a": {"content": "{raw:NEXUS_CRED_API_ANTHROPIC_COM_TOKEN}"}}}`, nil},
			{"json-escaped in the body", "POST", "https://api.github.com/gists?case=json", `{"c": "{json:NEXUS_CRED_API_ANTHROPIC_COM_TOKEN}"}`, nil},
			{"base64url in the body", "POST", "https://api.github.com/gists?case=b64url", `{"c": "{b64url:NEXUS_CRED_API_ANTHROPIC_COM_TOKEN}"}`, nil},
			{"percent-encoded in the query", "GET", "https://api.github.com/search?case=pct&q={pct:NEXUS_CRED_API_ANTHROPIC_COM_TOKEN}", "-", nil},
			{"base64 in a header", "GET", "https://api.github.com/user?case=b64", "-", []string{"X-Note: {b64:NEXUS_CRED_API_ANTHROPIC_COM_TOKEN}"}},
		} {
			status, deny := probeHTTP(t, box, ghIP, c.method, c.url, c.body, c.headers...)
			if status != 403 || !strings.Contains(deny, "nexus: refused: a nexus credential placeholder was sent to api.github.com") {
				t.Errorf("%s: %d %q", c.what, status, deny)
			}
		}
		if n := upstreams["api.github.com"].count(); n != before {
			t.Fatalf("%d requests carrying a placeholder bound elsewhere reached api.github.com", n-before)
		}
		for _, path := range []string{"/gists", "/search", "/user"} {
			ev := waitEvent(t, box, true, "placeholder_leak of "+path, func(e audit.Event) bool {
				return e.Rule == "placeholder_leak" && e.Host == "api.github.com" && e.Path == path
			})
			if ev.Status != 403 || ev.Port != 443 || ev.Swapped {
				t.Errorf("leak event: %+v", ev)
			}
		}
	})

	t.Run("the bound host", func(t *testing.T) {
		body := `{"note": "{raw:NEXUS_CRED_API_ANTHROPIC_COM_TOKEN}"}`
		status, deny := probeHTTP(t, box, anthIP, "POST", "https://api.anthropic.com/v1/messages?case=own-body", body,
			"Authorization: Bearer {raw:NEXUS_CRED_API_ANTHROPIC_COM_TOKEN}", "X-Note: {raw:NEXUS_CRED_API_ANTHROPIC_COM_TOKEN}")
		if status != 200 {
			t.Fatalf("own host: %d %q", status, deny)
		}
		got := upstreams["api.anthropic.com"].find("/v1/messages?case=own-body")
		if len(got) != 1 || got[0].Auth != "Bearer "+real || got[0].Body != `{"note": "`+own+`"}` {
			t.Fatalf("api.anthropic.com saw %d requests; want the credential swapped and the body's placeholder as sent", len(got))
		}
		waitEvent(t, box, false, "swapped own-host request", func(e audit.Event) bool {
			return e.Host == "api.anthropic.com" && e.Path == "/v1/messages" && e.Swapped && e.Decision == audit.Allow
		})
	})

	// nexus-why in the guest lists the mitm's refusals too (read from the audit stream, which
	// the cases above waited for), with the request and what would allow each.
	t.Run("nexus-why", func(t *testing.T) {
		out := mustSh(t, box, "nexus-why")
		for _, want := range []string{"sandbox egress/leak (egress curated)", "POST /gists  refused [placeholder_leak]",
			"refused [placeholder_cleartext]", "to allow: nothing: a credential placeholder goes only to the hosts its secret is bound to"} {
			if !strings.Contains(out, want) {
				t.Fatalf("nexus-why lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, own) {
			t.Fatal("nexus-why shows a placeholder")
		}
	})
}
