package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"
)

// caPath is where the guest finds the mitm's CA.
const caPath = "/etc/nexus/ca.pem"

// slot is {ENC:VAR}: the guest variable VAR encoded as ENC (raw, pct, b64, b64url, json).
var slot = regexp.MustCompile(`\{(raw|pct|b64|b64url|json):([A-Z0-9_]+)\}`)

// fill replaces the slots of s with the encoded variables, so the test never handles the values
// (nor do they appear in any command line).
func fill(s string) string {
	return slot.ReplaceAllStringFunc(s, func(m string) string {
		p := slot.FindStringSubmatch(m)
		v := os.Getenv(p[2])
		var b strings.Builder
		switch p[1] {
		case "pct":
			for i := 0; i < len(v); i++ {
				fmt.Fprintf(&b, "%%%02X", v[i])
			}
			return b.String()
		case "b64":
			return base64.StdEncoding.EncodeToString([]byte(v))
		case "b64url":
			return base64.RawURLEncoding.EncodeToString([]byte(v))
		case "json":
			for i := 0; i < len(v); i++ {
				fmt.Fprintf(&b, `\u%04x`, v[i])
			}
			return b.String()
		}
		return v
	})
}

// httpProbe sends one request and prints its status and X-Nexus-Deny:
//
//	probe http IP METHOD URL BODY [NAME:VALUE]...
//
// The connection goes to IP (the port is the URL's), the TLS server name is the URL's host, the
// trusted roots are the guest's nexus CA. URL, BODY ("-" for none) and header values may hold
// {ENC:VAR} slots.
func httpProbe(args []string) int {
	if len(args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: probe http IP METHOD URL BODY [NAME:VALUE]...")
		return 2
	}
	ip, method, url, body := args[0], args[1], fill(args[2]), args[3]
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(caPath); err == nil {
		pool.AppendCertsFromPEM(pem)
	}
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(ip, port))
		},
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}}
	var rd io.Reader
	if body != "-" {
		rd = strings.NewReader(fill(body))
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		fmt.Println("request:", err)
		return 1
	}
	for _, h := range args[4:] {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, fill(strings.TrimSpace(v)))
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	fmt.Printf("status %d\ndeny: %s\n", resp.StatusCode, resp.Header.Get("X-Nexus-Deny"))
	return 0
}
