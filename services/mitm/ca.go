package mitm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/IniZio/nexus/pkg/atomicfile"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Files of the CA directory ($NEXUS_HOME/ca).
const (
	CACertFile = "ca.pem"     // the certificate guests trust, mode 0644
	CAKeyFile  = "ca-key.pem" // the private key, mode 0600
	caLockFile = ".lock"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 30 * 24 * time.Hour
	// leafRenewBefore re-mints a cached leaf this long before it expires.
	leafRenewBefore = 24 * time.Hour
)

// CA is the per-installation MITM certificate authority. It is generated once into a directory
// and reused across restarts. Leaves share one in-memory ECDSA P-256 key (as mitmproxy's do):
// minting a leaf is then one signature, not a key generation.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	leafKey *ecdsa.PrivateKey
}

// LoadOrCreateCA loads the CA from dir, creating it (ECDSA P-256, key file 0600) when it does
// not exist yet. Concurrent callers, also in other processes, agree on one CA (flock on dir/.lock).
func LoadOrCreateCA(dir string) (*CA, error) {
	if dir == "" {
		return nil, errors.New("mitm ca: no CA directory configured")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("mitm ca: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, caLockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("mitm ca: lock %s: %w", dir, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	ca, err := loadCA(dir)
	if errors.Is(err, fs.ErrNotExist) {
		ca, err = createCA(dir)
	}
	if err != nil {
		return nil, err
	}
	ca.leafKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: leaf key: %w", err)
	}
	return ca, nil
}

func loadCA(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, err
	}
	keyPath := filepath.Join(dir, CAKeyFile)
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(keyPath); err == nil && st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(keyPath, 0o600); err != nil {
			return nil, fmt.Errorf("mitm ca: %s is readable by others and cannot be fixed: %w", keyPath, err)
		}
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("mitm ca: %s holds no certificate", filepath.Join(dir, CACertFile))
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: %s: %w", filepath.Join(dir, CACertFile), err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("mitm ca: %s holds no key", keyPath)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: %s: %w", keyPath, err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("mitm ca: %s does not match %s", keyPath, CACertFile)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("mitm ca: %s is not a CA certificate", CACertFile)
	}
	if time.Now().After(cert.NotAfter) {
		return nil, fmt.Errorf("mitm ca: the CA in %s expired on %s: remove %s and %s to generate a new one (guests must then be recreated)",
			dir, cert.NotAfter.Format(time.DateOnly), CACertFile, CAKeyFile)
	}
	return &CA{cert: cert, key: key, certPEM: certPEM}, nil
}

func createCA(dir string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	spki, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: %w", err)
	}
	ski := sha256.Sum256(spki)
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"nexus"}, CommonName: "nexus MITM CA " + host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          ski[:20],
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: create certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	// Key first: a crash between the two renames leaves no certificate, so the next start
	// regenerates both instead of pairing a certificate with a missing key.
	if err := atomicfile.WriteFile(filepath.Join(dir, CAKeyFile), keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, CACertFile), certPEM, 0o644); err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, certPEM: certPEM}, nil
}

// CertPEM is the CA certificate in PEM form, for guests to trust.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

// Certificate is the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// mint signs a fresh leaf for one host name or IP literal.
func (ca *CA) mint(host string, now time.Time) (*tls.Certificate, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: sign leaf: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("mitm ca: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}, nil
}

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("mitm ca: serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
