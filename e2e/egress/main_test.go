// Package egress_test proves the egress perimeter end to end on real guests: a whole nexus stack
// (`nexus up` in a temp home) whose netstack and mitm reach fake upstreams on loopback
// (--resolve) that serve TLS from a test CA the mitm trusts (--extra-ca). Guests run
// curl, nc, nslookup and ping; the upstreams record what reached them.
package egress_test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

var (
	stack *testutil.Stack
	// Fake upstreams by host name.
	upstreams = map[string]*upstream{}
	// udpSeen counts datagrams that reached the UDP listener behind example.test.
	udpSeen *udpSink
	// secrets collects every real token and placeholder the run handled; TestMain checks that
	// none of them appears in a log or an audit event.
	secrets = &secretSet{}
	// earlierLogs holds the logs of stacks killed by a test (a restart starts a new log).
	earlierLogs strings.Builder
	// probeBin is the static guest tool of testdata/probe.
	probeBin string
)

// Fake hosts: TLS upstreams (the mitm verifies them against the test CA) and one plain HTTP one.
var (
	tlsHosts  = []string{"api.github.com", "api.anthropic.com", "evil.example"}
	plainHost = "example.test"
)

func TestMain(m *testing.M) {
	testutil.Main(m, &stack, testutil.Warm(), testutil.Setup(setup), testutil.Check(leakScan))
}

// setup builds the guest probe and starts the fake upstreams the stack resolves to.
func setup(f *testutil.Fixture) error {
	pki, err := testutil.NewPKI(append([]string{plainHost}, tlsHosts...)...)
	if err != nil {
		return fmt.Errorf("test pki: %w", err)
	}
	probeBin = filepath.Join(f.Dir, "probe")
	build := exec.Command("go", "build", "-o", probeBin, "./testdata/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build probe: %v\n%s", err, out)
	}
	caFile, err := pki.WriteCA(f.Dir)
	if err != nil {
		return err
	}
	var resolve []string
	for _, h := range append([]string{plainHost}, tlsHosts...) {
		tc := pki.ServerConfig()
		if h == plainHost {
			tc = nil
		}
		u, err := startUpstream(h, tc)
		if err != nil {
			return err
		}
		f.Cleanup(u.close)
		upstreams[h] = u
		resolve = append(resolve, u.srv.Resolve())
	}
	// A UDP listener on the same port number as example.test's HTTP server: allow-all UDP to
	// example.test lands here, curated UDP never does.
	if udpSeen, err = listenUDP(upstreams[plainHost].srv.Addr); err != nil {
		return err
	}
	f.Cleanup(udpSeen.close)
	dnsAddr, err := startFakeDNS(f)
	if err != nil {
		return err
	}
	f.Flags("--resolve="+strings.Join(resolve, ","), "--extra-ca="+caFile, "--upstream-dns="+dnsAddr)
	return nil
}

// leakScan fails the run when a token or placeholder appears in a log or an audit event.
func leakScan(*testutil.Stack) error {
	if leaks := scanForSecrets(); len(leaks) > 0 {
		return fmt.Errorf("secrets leaked:\n  %s", strings.Join(leaks, "\n  "))
	}
	fmt.Fprintf(os.Stderr, "leak scan: %d secret values absent from %d bytes of stack log and the audit stream\n", secrets.len(), earlierLogs.Len()+len(stack.Log()))
	return nil
}

// seen is one request that reached a fake upstream.
type seen struct {
	Host, Path, Auth string
	Body             string // the first 64 KiB
}

// upstream is a fake internet host on loopback that records every request.
type upstream struct {
	name string
	srv  *testutil.Upstream
	mu   sync.Mutex
	reqs []seen
}

func startUpstream(name string, tc *tls.Config) (*upstream, error) {
	u := &upstream{name: name}
	var err error
	u.srv, err = testutil.ServeUpstream(name, u, tc)
	return u, err
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	u.mu.Lock()
	u.reqs = append(u.reqs, seen{Host: r.Host, Path: r.URL.RequestURI(), Auth: r.Header.Get("Authorization"), Body: string(body)})
	u.mu.Unlock()
	if r.URL.Path == "/stream" {
		serveStream(w, r) // expiry_test.go
		return
	}
	fmt.Fprintf(w, "hello from fake %s\n", u.name)
}

// find returns the requests whose path starts with prefix.
func (u *upstream) find(prefix string) []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []seen
	for _, s := range u.reqs {
		if strings.HasPrefix(s.Path, prefix) {
			out = append(out, s)
		}
	}
	return out
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.reqs)
}

func (u *upstream) close() { u.srv.Close() }

type udpSink struct {
	c    net.PacketConn
	mu   sync.Mutex
	msgs [][]byte
}

func listenUDP(addr string) (*udpSink, error) {
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("udp listener on %s: %w", addr, err)
	}
	s := &udpSink{c: c}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.msgs = append(s.msgs, append([]byte(nil), buf[:n]...))
			s.mu.Unlock()
			c.WriteTo([]byte("pong "+string(bytes.TrimSpace(buf[:n]))+"\n"), from)
		}
	}()
	return s, nil
}

// got reports whether a datagram containing marker arrived.
func (s *udpSink) got(marker string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.msgs {
		if bytes.Contains(m, []byte(marker)) {
			return true
		}
	}
	return false
}

func (s *udpSink) close() { s.c.Close() }

type secretSet struct {
	mu   sync.Mutex
	vals map[string]string // value → what it is
}

func (s *secretSet) add(what, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vals == nil {
		s.vals = map[string]string{}
	}
	if v != "" {
		s.vals[v] = what
	}
}

func (s *secretSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.vals)
}

// scanForSecrets greps the stack's log, every audit event and the plaintext files under
// $NEXUS_HOME (real tokens only: the store is encrypted at rest) for the collected values.
func scanForSecrets() []string {
	secrets.mu.Lock()
	vals := secrets.vals
	secrets.mu.Unlock()
	var leaks []string
	log := earlierLogs.String() + stack.Log()
	out, errOut, code := stack.Nexus(nopTB{}, "audit", "tail", "--json")
	if code != 0 {
		leaks = append(leaks, "cannot read the audit stream: "+errOut)
	}
	for v, what := range vals {
		if strings.Contains(log, v) {
			leaks = append(leaks, what+" appears in the nexus up log")
		}
		if strings.Contains(out, v) {
			leaks = append(leaks, what+" appears in an audit event")
		}
	}
	filepath.Walk(string(stack.Home), func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || fi.Size() > 64<<20 || strings.HasSuffix(p, ".qcow2") || strings.HasSuffix(p, ".ext4") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for v, what := range vals {
			if strings.HasPrefix(what, "real") && bytes.Contains(b, []byte(v)) {
				leaks = append(leaks, what+" is stored in plaintext in "+p)
			}
		}
		return nil
	})
	return leaks
}

// nopTB lets TestMain use the stack's CLI helper.
type nopTB struct{ testing.TB }

func (nopTB) Helper() {}
