package mitm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"time"
)

// newUpstreamTransport is the client side of the MITM: HTTP/1.1, TLS verified against the system
// roots plus Config.ExtraRootCAs, never through an environment proxy, with ResolverOverrides
// applied at dial time.
func newUpstreamTransport(cfg Config) (*http.Transport, error) {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	for _, c := range cfg.ExtraRootCAs {
		roots.AddCert(c)
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	overrides := map[string]string{}
	for k, v := range cfg.ResolverOverrides {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return nil, fmt.Errorf("mitm: resolver override %s=%s: want host:port", k, v)
		}
		overrides[k] = v
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if len(overrides) > 0 {
			host, _, _ := net.SplitHostPort(addr)
			if v, ok := overrides[addr]; ok {
				addr = v
			} else if v, ok := overrides[host]; ok {
				addr = v
			} else if v, ok := overrides["*"]; ok {
				addr = v
			}
		}
		return dialer.DialContext(ctx, network, addr)
	}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           dial,
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		MaxIdleConns:          512,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}, nil
}
