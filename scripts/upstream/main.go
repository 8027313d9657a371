// Command upstream stands in for the internet in the `make run` demo: an HTTP and an HTTPS
// server on loopback (certificate from a throwaway CA written to -ca) that answer every request
// and report what arrived, so the demo can show that the guest's placeholder became the real
// credential on the wire. It never prints a credential, only whether it matched -expect.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	httpAddr := flag.String("http", "127.0.0.1:18080", "plain HTTP address")
	httpsAddr := flag.String("https", "127.0.0.1:18443", "HTTPS address")
	caFile := flag.String("ca", "upstream-ca.pem", "where to write the CA certificate")
	hosts := flag.String("hosts", "example.test,api.github.com", "names on the certificate")
	expect := flag.String("expect-env", "", "environment variable holding the credential the demo expects to arrive")
	flag.Parse()

	want := os.Getenv(*expect)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		verdict := "no credential"
		switch {
		case auth == "":
		case want != "" && auth == "Bearer "+want:
			verdict = "the REAL credential (sha256 " + short(want) + ")"
		default:
			verdict = "an unknown credential (sha256 " + short(strings.TrimPrefix(auth, "Bearer ")) + ")"
		}
		log.Printf("upstream: %s %s%s from the sandbox, carrying %s", r.Method, r.Host, r.URL.Path, verdict)
		fmt.Fprintf(w, "hello from the upstream %s: you sent %s\n", r.Host, verdict)
	})
	cert, caPEM, err := issue(strings.Split(*hosts, ","))
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*caFile, caPEM, 0o644); err != nil {
		log.Fatal(err)
	}
	ln, err := tls.Listen("tcp", *httpsAddr, &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(ln, handler)
	log.Fatal(http.ListenAndServe(*httpAddr, handler))
}

func short(s string) string {
	h := sha256.Sum256([]byte(s))
	return fmt.Sprintf("%x", h[:4])
}

// issue makes a CA and a leaf for hosts, and returns the leaf and the CA's PEM.
func issue(hosts []string) (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nexus demo upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}
