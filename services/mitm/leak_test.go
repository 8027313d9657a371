package mitm

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
)

// seenRequest is what reached a test upstream: only requests whose body arrived whole.
type seenRequest struct{ path, auth, body, header string }

type seenLog struct {
	mu   sync.Mutex
	reqs []seenRequest
}

func (l *seenLog) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return // cut short: nothing a server would act on
		}
		l.mu.Lock()
		l.reqs = append(l.reqs, seenRequest{r.URL.RequestURI(), r.Header.Get("Authorization"), string(b), r.Header.Get("X-Note")})
		l.mu.Unlock()
		io.WriteString(w, "ok")
	})
}

func (l *seenLog) all() []seenRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]seenRequest(nil), l.reqs...)
}

// TestCleartextPlaceholderRefused: a placeholder in a plain-HTTP request, even to the host it is
// bound to, is refused as placeholder_cleartext wherever it is, and neither the real credential
// nor the placeholder reaches the host; plain HTTP without one still passes.
func TestCleartextPlaceholderRefused(t *testing.T) {
	plain := &seenLog{}
	plainSrv := httptest.NewServer(plain.handler())
	t.Cleanup(plainSrv.Close)
	resolved := 0
	var mu sync.Mutex
	h := newHarness(t, http.NotFoundHandler(), func(c *proxyConfig) {
		c.ResolverOverrides = map[string]string{"api.example.com:80": plainSrv.Listener.Addr().String()}
		inner := c.Resolver
		c.Resolver = ResolverFunc(func(ctx context.Context, sb, host, ph string) (string, error) {
			mu.Lock()
			resolved++
			mu.Unlock()
			return inner.Resolve(ctx, sb, host, ph)
		})
	})
	send := func(t *testing.T, raw string) *http.Response {
		t.Helper()
		c, resp := h.rawTunnel(t, "api.example.com:80", basic(testSandbox, testToken))
		if resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %s", resp.Status)
		}
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		r, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r.Body)
		return r
	}
	body := `{"token": "` + placeholder + `"}`
	for _, c := range []struct{ name, raw string }{
		{"bearer", "GET /bearer HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer " + placeholder + "\r\n\r\n"},
		{"basic", "GET /basic HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: " + basic("x-access-token", placeholder) + "\r\n\r\n"},
		{"query", "GET /q?key=" + url.QueryEscape(placeholder) + " HTTP/1.1\r\nHost: api.example.com\r\n\r\n"},
		{"body", fmt.Sprintf("POST /body HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: %d\r\n\r\n%s", len(body), body)},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := send(t, c.raw)
			if r.StatusCode != 403 || !strings.Contains(r.Header.Get(DenyHeader), "over plain HTTP") {
				t.Fatalf("%s: %s %q", c.name, r.Status, r.Header.Get(DenyHeader))
			}
		})
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		if n := len(h.events(ruleIs(RulePlaceholderCleartext))); n != 4 {
			return fmt.Errorf("%d placeholder_cleartext events, want 4", n)
		}
		return nil
	})
	for _, ev := range h.events(ruleIs(RulePlaceholderCleartext)) {
		if ev.Decision != audit.Deny || ev.Status != 403 || ev.Host != "api.example.com" || ev.Port != 80 || ev.Swapped {
			t.Errorf("cleartext event: %+v", ev)
		}
	}
	if got := plain.all(); len(got) != 0 {
		t.Fatalf("the plain upstream saw %+v", got)
	}
	mu.Lock()
	if resolved != 0 {
		t.Errorf("the credential was resolved %d times for a cleartext request", resolved)
	}
	mu.Unlock()
	// Plain HTTP without a placeholder is not affected.
	if r := send(t, "GET /fine HTTP/1.1\r\nHost: api.example.com\r\n\r\n"); r.StatusCode != 200 {
		t.Fatalf("plain request: %s", r.Status)
	}
	if got := plain.all(); len(got) != 1 || got[0].path != "/fine" {
		t.Fatalf("the plain upstream saw %+v", got)
	}
	assertNoPlaceholderIn(t, h)
}

// assertNoPlaceholderIn fails when a placeholder or the real token, in any form the scanner
// knows, is in the proxy's logs or audit events.
func assertNoPlaceholderIn(t *testing.T, h *harness) {
	t.Helper()
	sb := scanSandbox(t)
	var text strings.Builder
	text.WriteString(h.logs.String())
	for _, ev := range h.rec.all() {
		fmt.Fprintf(&text, "%+v\n", ev)
	}
	var f forms
	if f.refusal([]byte(text.String()), sb, "nowhere.example", false) != "" {
		t.Fatalf("a placeholder is in the logs or the audit events:\n%s", text.String())
	}
	if strings.Contains(text.String(), realToken) {
		t.Fatal("the real token is in the logs or the audit events")
	}
}

// TestPlaceholderLeakAnywhere: a placeholder bound to api.example.com sent to other.example.com
// in any part of the request and any form is placeholder_leak, and nothing of it arrives.
func TestPlaceholderLeakAnywhere(t *testing.T) {
	up := &seenLog{}
	h := newHarness(t, up.handler())
	c := h.client(t, testSandbox, testToken)
	for _, fm := range placeholderForms() {
		for _, where := range []string{"query", "header", "body", "long body", "streamed body"} {
			t.Run(fm.name+"/"+where, func(t *testing.T) {
				u := "https://other.example.com/leak"
				var body io.Reader
				method := "GET"
				switch where {
				case "query":
					// As a client would put it there: escaped where the URL needs it.
					if strings.ContainsAny(fm.form, ` \+/=`) {
						u += "?k=" + url.QueryEscape(fm.form)
					} else {
						u += "?k=" + fm.form
					}
				case "body":
					method, body = "POST", strings.NewReader(`{"a": "`+fm.form+`"}`)
				case "long body":
					// Of known length but past what is scanned whole: scanned as it streams.
					method, body = "POST", strings.NewReader(strings.Repeat("lorem ipsum ", 7000)+fm.form+" end")
				case "streamed body":
					// Longer than what is scanned whole, of unknown length: chunked, scanned as
					// it streams; the placeholder well past the first window.
					method = "POST"
					body = io.MultiReader(strings.NewReader(strings.Repeat("lorem ipsum ", 10000)+fm.form), strings.NewReader(" end"))
				}
				req, _ := http.NewRequest(method, u, body)
				if where == "streamed body" {
					req.ContentLength = -1
					req.Body = io.NopCloser(body)
				}
				if where == "header" {
					req.Header.Set("X-Note", fm.form)
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 403 || !strings.Contains(resp.Header.Get(DenyHeader), "a nexus credential placeholder was sent to other.example.com") {
					t.Fatalf("%s %q", resp.Status, resp.Header.Get(DenyHeader))
				}
			})
		}
	}
	if got := up.all(); len(got) != 0 {
		t.Fatalf("other.example.com got %d requests whole, first %+v", len(got), got[0])
	}
	ev := h.waitEvent(t, ruleIs(RulePlaceholderLeak))
	if ev.Host != "other.example.com" || ev.Status != 403 || ev.Decision != audit.Deny {
		t.Errorf("leak event: %+v", ev)
	}
	assertNoPlaceholderIn(t, h)
}

// TestBoundPlaceholderElsewhereForwarded: on the host it is bound to, a placeholder outside the
// credential position (body, query, another header) is forwarded as the placeholder, never
// swapped; the Authorization one beside it is.
func TestBoundPlaceholderElsewhereForwarded(t *testing.T) {
	up := &seenLog{}
	h := newHarness(t, up.handler())
	c := h.client(t, testSandbox, testToken)
	body := `{"note": "` + placeholder + `"}`
	req, _ := http.NewRequest("POST", "https://api.example.com/own?k="+placeholder, strings.NewReader(body))
	req.Header.Set("X-Note", placeholder)
	req.Header.Set("Authorization", "Bearer "+placeholder)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s %q", resp.Status, resp.Header.Get(DenyHeader))
	}
	// And without a credential, only elsewhere: forwarded as it is, nothing swapped.
	req, _ = http.NewRequest("POST", "https://api.example.com/own2", strings.NewReader(body))
	if resp, err = c.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := up.all()
	if len(got) != 2 {
		t.Fatalf("upstream saw %+v", got)
	}
	want := seenRequest{path: "/own?k=" + placeholder, auth: "Bearer " + realToken, body: body, header: placeholder}
	if got[0] != want {
		t.Errorf("upstream saw %+v, want %+v", got[0], want)
	}
	if want := (seenRequest{path: "/own2", body: body}); got[1] != want {
		t.Errorf("upstream saw %+v, want %+v", got[1], want)
	}
	ev := h.waitEvent(t, func(e audit.Event) bool { return e.Path == "/own2" })
	if ev.Swapped || ev.Decision != audit.Allow {
		t.Errorf("event: %+v", ev)
	}
}
