package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
)

func testCAPEM(t *testing.T) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestInstallCA: the CA lands at its path and once at the end of the system bundle, whose
// existing certificates are kept; a second install (a restarted guest) appends nothing.
func TestInstallCA(t *testing.T) {
	root := t.TempDir()
	bundle := filepath.Join(root, agentproto.SystemCABundle)
	os.MkdirAll(filepath.Dir(bundle), 0o755)
	os.WriteFile(bundle, []byte("-----BEGIN CERTIFICATE-----\nexisting\n-----END CERTIFICATE-----"), 0o644)
	ca := agentproto.TrustCA{Path: "/etc/nexus/ca.pem", PEM: testCAPEM(t)}
	if err := checkTrustCA(&ca); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := InstallCA(root, ca); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(filepath.Join(root, "etc/nexus/ca.pem"))
	if string(got) != string(ca.PEM) {
		t.Fatalf("ca file: %q", got)
	}
	b, _ := os.ReadFile(bundle)
	if !strings.HasPrefix(string(b), "-----BEGIN CERTIFICATE-----\nexisting\n-----END CERTIFICATE-----\n") {
		t.Fatalf("existing bundle not kept: %q", b)
	}
	if strings.Count(string(b), caBundleMarker) != 1 || !strings.HasSuffix(string(b), string(ca.PEM)) {
		t.Fatalf("bundle: %q", b)
	}
}

// TestCheckTrustCA refuses what a hostile host (or a bug) could send before anything is written.
func TestCheckTrustCA(t *testing.T) {
	good := testCAPEM(t)
	for name, ca := range map[string]agentproto.TrustCA{
		"relative path": {Path: "etc/ca.pem", PEM: good},
		"unclean path":  {Path: "/etc/../root/.ssh/authorized_keys", PEM: good},
		"empty":         {Path: "/etc/ca.pem"},
		"not pem":       {Path: "/etc/ca.pem", PEM: []byte("hello")},
		"two certs":     {Path: "/etc/ca.pem", PEM: append(append([]byte{}, good...), good...)},
		"key":           {Path: "/etc/ca.pem", PEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})},
		"huge":          {Path: "/etc/ca.pem", PEM: make([]byte, agentproto.MaxTrustCABytes+1)},
	} {
		if err := checkTrustCA(&ca); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
