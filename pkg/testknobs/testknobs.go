// Package testknobs reads the two environment settings that let tests stand fake upstreams up
// on loopback (DESIGN §5): NEXUS_RESOLVE (host=addr pairs, like curl --resolve, consulted by
// the netstack's DNS and the mitm's dialer) and NEXUS_EXTRA_CA (a PEM file of extra upstream
// roots for the mitm). Production leaves both unset.
package testknobs

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
)

// Resolve parses NEXUS_RESOLVE="api.github.com=127.0.0.1:4443,github.com=127.0.0.1:4444".
func Resolve() (map[string]string, error) {
	v := os.Getenv("NEXUS_RESOLVE")
	if v == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, pair := range strings.Split(v, ",") {
		host, addr, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || host == "" || addr == "" {
			return nil, fmt.Errorf("NEXUS_RESOLVE: %q is not host=addr", pair)
		}
		out[strings.ToLower(host)] = addr
	}
	return out, nil
}

// ExtraRoots reads the certificates in NEXUS_EXTRA_CA.
func ExtraRoots() ([]*x509.Certificate, error) {
	path := os.Getenv("NEXUS_EXTRA_CA")
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("NEXUS_EXTRA_CA: %w", err)
	}
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("NEXUS_EXTRA_CA: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("NEXUS_EXTRA_CA: no certificate in %s", path)
	}
	return out, nil
}
