// Package policy_test proves the request policies of issue 6 end to end on real guests: a whole
// nexus stack whose mitm reaches a fake github.com and api.github.com on loopback (NEXUS_RESOLVE,
// TLS from a test CA in NEXUS_EXTRA_CA). The fake github.com serves real bare repositories
// through `git http-backend`; guests run the real git and curl of nexus-base.
package policy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

var (
	stack *testutil.Stack
	gh    *fakeGitHub // github.com
	api   *fakeAPI    // api.github.com
	// ghToken is the real GH_TOKEN the stack's secret store holds; guests only see a placeholder.
	ghToken string
	// gitEnv runs the host's git on the fake's bare repos.
	gitEnv []string
)

func TestMain(m *testing.M) {
	if err := testutil.QEMUAvailable(); err != nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "CI needs QEMU:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "skipping policy tests:", err)
		os.Exit(0)
	}
	if _, err := exec.LookPath("git"); err != nil {
		fmt.Fprintln(os.Stderr, "policy tests need git on the host:", err)
		os.Exit(1)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "nexus-policy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	gitEnv = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	caPEM, leaf, err := testPKI([]string{"github.com", "api.github.com"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "test pki:", err)
		return 1
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tc := &tls.Config{Certificates: []tls.Certificate{leaf}}
	if gh, err = startGitHub(filepath.Join(dir, "repos"), tc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer gh.close()
	for _, repo := range []string{"acme/app", "evil/leak"} {
		if err := gh.bareRepo(repo); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if api, err = startAPI(tc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer api.close()

	stack, err = testutil.StartStack("NEXUS_RESOLVE=github.com="+gh.addr+",api.github.com="+api.addr, "NEXUS_EXTRA_CA="+caFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b := make([]byte, 20)
	rand.Read(b)
	ghToken = "ghp_" + hex.EncodeToString(b)
	if _, errOut, code := stack.NexusIn(nopTB{}, []byte(ghToken+"\n"), "secret", "set", "GH_TOKEN"); code != 0 {
		fmt.Fprintln(os.Stderr, "secret set GH_TOKEN:", errOut)
		stack.Stop()
		return 1
	}
	code := m.Run()
	if code == 0 && strings.Contains(stack.Log(), ghToken) {
		fmt.Fprintln(os.Stderr, "FAIL: the real GH_TOKEN appears in the nexus up log")
		code = 1
	}
	if code != 0 {
		log := stack.Log()
		if len(log) > 20000 {
			log = log[len(log)-20000:]
		}
		fmt.Fprintln(os.Stderr, "---- nexus up log (tail) ----\n"+log)
	}
	stack.Stop()
	return code
}

// testPKI makes a CA and one leaf for hosts.
func testPKI(hosts []string) ([]byte, tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nexus e2e policy CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}, nil
}

// nopTB lets TestMain use the stack's CLI helper.
type nopTB struct{ testing.TB }

func (nopTB) Helper() {}
