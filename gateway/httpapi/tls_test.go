package httpapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

// The TLS serving path end to end: Run serves https with the certificate and key files it was
// given, a client trusting their CA gets answers, one that does not is refused at the
// handshake, plain HTTP gets no API, and the guard still holds (token, Origin over https).
func TestTLSServing(t *testing.T) {
	pki, err := testutil.NewPKI("localhost")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key, err := pki.WriteLeaf(dir)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.TLSCert, c.TLSKey, c.Listener = cert, key, ln })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	url := "https://localhost:" + port

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pki.CAPEM)
	trusting := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(c *http.Client, scheme, token string, hdr ...string) (int, string, error) {
		req, _ := http.NewRequest("GET", scheme+"://localhost:"+port+"/v1/sandboxes", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}

	var status int
	var body string
	testutil.WaitFor(t, 10*time.Second, func() error {
		status, body, err = get(trusting, "https", f.tokens[ScopeRead])
		return err
	})
	var list listResult
	if status != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != "default/box" {
		t.Fatalf("GET %s/v1/sandboxes over TLS: %d %s", url, status, body)
	}
	if status, body, _ := get(trusting, "https", ""); status != 401 {
		t.Errorf("no token over TLS: %d %s", status, body)
	}
	if status, body, _ := get(trusting, "https", f.tokens[ScopeRead], "Origin", "http://localhost:"+port); status != 403 {
		t.Errorf("an http Origin on the https server: %d %s", status, body)
	}
	if status, body, _ := get(trusting, "https", f.tokens[ScopeRead], "Origin", url); status != 200 {
		t.Errorf("its own https Origin: %d %s", status, body)
	}

	// A client that does not trust the CA fails the handshake; plain HTTP reaches no route.
	_, _, err = get(&http.Client{Timeout: 10 * time.Second}, "https", f.tokens[ScopeRead])
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Errorf("a client without the CA: %v", err)
	}
	if status, body, err := get(&http.Client{Timeout: 10 * time.Second}, "http", f.tokens[ScopeRead]); err == nil && (status == 200 || strings.Contains(body, "sandboxes")) {
		t.Errorf("plain http on the TLS port answered: %d %s", status, body)
	}
}
