package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// PKI is a private CA and one leaf for a set of host names: what fake upstreams present and
// what a stack is told to trust (the extra upstream CA), the way a private PKI would.
type PKI struct {
	CAPEM []byte          // the CA certificate, PEM
	Leaf  tls.Certificate // the leaf for every host, signed by the CA
}

// NewPKI makes a CA and one leaf whose names are hosts (the first is its common name).
func NewPKI(hosts ...string) (*PKI, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nexus test upstream CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	return &PKI{
		CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Leaf:  tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key},
	}, nil
}

// WriteCA writes the CA certificate to dir/ca.pem and returns its path.
func (p *PKI) WriteCA(dir string) (string, error) {
	path := filepath.Join(dir, "ca.pem")
	return path, os.WriteFile(path, p.CAPEM, 0o644)
}

// ServerConfig is the TLS configuration of a fake upstream presenting the leaf.
func (p *PKI) ServerConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.Leaf}}
}

// Upstream is a fake internet host: an HTTP server on a random loopback port, speaking TLS when
// it has a configuration. A stack reaches it through a resolver override (Resolve).
type Upstream struct {
	Name string // the host name it stands for
	Addr string // host:port on loopback
	srv  *http.Server
}

// ServeUpstream starts h as the fake host name, over TLS with tc unless tc is nil.
func ServeUpstream(name string, h http.Handler, tc *tls.Config) (*Upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{Name: name, Addr: ln.Addr().String()}
	u.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	go u.srv.Serve(ln)
	return u, nil
}

// Resolve is the upstream's resolver override entry, host=addr (curl's --resolve).
func (u *Upstream) Resolve() string { return u.Name + "=" + u.Addr }

// Close stops the server.
func (u *Upstream) Close() error { return u.srv.Close() }

// WriteLeaf writes the leaf's certificate and key to dir/leaf.pem and dir/leaf-key.pem (what a
// server given --tls-cert and --tls-key files loads) and returns their paths.
func (p *PKI) WriteLeaf(dir string) (cert, key string, err error) {
	der, err := x509.MarshalPKCS8PrivateKey(p.Leaf.PrivateKey)
	if err != nil {
		return "", "", err
	}
	cert, key = filepath.Join(dir, "leaf.pem"), filepath.Join(dir, "leaf-key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.Leaf.Certificate[0]}), 0o644); err != nil {
		return "", "", err
	}
	return cert, key, os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}
