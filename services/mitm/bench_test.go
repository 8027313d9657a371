package mitm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/audit"
)

// The benchmarks all fetch 1 KB over keep-alive from the same loopback TLS origin with 4
// concurrent clients; compare req/s: direct, goproxy CONNECT pass-through, our MITM with a warm
// leaf (policy, swap and audit on) and our MITM with a new host (new CONNECT, new leaf) each time.

var kb = strings.Repeat("x", 1024)

func benchHarness(b *testing.B) (*harness, *atomic.Int64) {
	var events atomic.Int64
	h := newHarness(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, kb)
	}), func(c *proxyConfig) {
		c.Logger = zerolog.Nop()
		c.Audit = audit.SinkFunc(func(context.Context, audit.Event) { events.Add(1) })
		c.LeafCacheSize = 256
	})
	sb, err := NewSandbox(mitmapi.SandboxPolicy{
		ID: "bench", TokenHash: mitmapi.HashHex(testToken), AllowedHosts: []string{"*.example.com"},
		Credentials: []mitmapi.CredentialBinding{{PlaceholderHash: mitmapi.HashHex(placeholder), Hosts: []string{"*.example.com"}}},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	h.reg.Put(sb)
	return h, &events
}

// run4 runs b.N requests on 4 goroutines and reports req/s and latency percentiles.
func run4(b *testing.B, do func(i int64) error) {
	b.ResetTimer()
	elapsed, lat, err := measure4(0, int64(b.N), do)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	report(b, int64(b.N), elapsed, lat)
}

// measure4 runs requests from+1..to on 4 goroutines; it returns the wall time and each latency.
func measure4(from, to int64, do func(i int64) error) (time.Duration, []time.Duration, error) {
	var next atomic.Int64
	next.Store(from)
	lat := make([][]time.Duration, 4)
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > to {
					return
				}
				t0 := time.Now()
				if err := do(i); err != nil {
					failed.Store(err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	err, _ := failed.Load().(error)
	return time.Since(start), slices.Concat(lat...), err
}

func report(b *testing.B, n int64, elapsed time.Duration, all []time.Duration) {
	slices.Sort(all)
	b.ReportMetric(float64(n)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(all[len(all)-1].Microseconds()), "max-µs")
}

func fetch(c *http.Client, u string, hdr http.Header) error {
	req, _ := http.NewRequest("GET", u, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != 1024 || resp.StatusCode != 200 {
		return fmt.Errorf("status %d, %d bytes, %v (%s)", resp.StatusCode, n, err, resp.Header.Get(DenyHeader))
	}
	return nil
}

func originPool(h *harness) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(h.upstream.Certificate())
	return p
}

func BenchmarkDirect(b *testing.B) {
	h, _ := benchHarness(b)
	origin := h.upstream.Listener.Addr().String()
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, origin)
		},
		TLSClientConfig: &tls.Config{RootCAs: originPool(h)}, MaxIdleConnsPerHost: 8,
	}}
	run4(b, func(int64) error { return fetch(c, "https://api.example.com/", nil) })
}

func BenchmarkGoproxyPassThrough(b *testing.B) {
	h, _ := benchHarness(b)
	c := passThroughClient(b, h)
	run4(b, func(int64) error { return fetch(c, "https://api.example.com/", nil) })
}

// passThroughClient reaches the harness's origin through goproxy's CONNECT pass-through (it
// splices the two TCP connections).
func passThroughClient(b *testing.B, h *harness) *http.Client {
	origin := h.upstream.Listener.Addr().String()
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = goproxyLogger{zerolog.Nop()}
	gp.ConnectDial = nil
	gp.Tr = &http.Transport{DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, n, origin)
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: gp}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return &http.Client{Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()}),
		TLSClientConfig: &tls.Config{RootCAs: originPool(h)}, MaxIdleConnsPerHost: 8,
	}}
}

// BenchmarkMITMWarm is our MITM with a warm leaf, policy, credential swap and audit all on. Its
// x-passthrough is its throughput over goproxy's CONNECT pass-through to the same origin,
// measured in the same run: eight alternating rounds of each, so the machine's drift falls on
// both alike.
func BenchmarkMITMWarm(b *testing.B) {
	h, events := benchHarness(b)
	c := h.client(b, "bench", testToken)
	pt := passThroughClient(b, h)
	hdr := http.Header{"Authorization": {"Bearer " + placeholder}}
	mitm := func(int64) error { return fetch(c, "https://api.example.com/", hdr) }
	pass := func(int64) error { return fetch(pt, "https://api.example.com/", nil) }
	const rounds = 8
	n := int64(b.N)
	var ours, theirs time.Duration
	var lat []time.Duration
	b.ResetTimer()
	for r := int64(0); r < rounds; r++ {
		from, to := n*r/rounds, n*(r+1)/rounds
		d, l, err := measure4(from, to, mitm)
		if err != nil {
			b.Fatal(err)
		}
		ours, lat = ours+d, append(lat, l...)
		if d, _, err = measure4(from, to, pass); err != nil {
			b.Fatal(err)
		}
		theirs += d
	}
	b.StopTimer()
	report(b, n, ours, lat)
	b.ReportMetric(theirs.Seconds()/ours.Seconds(), "x-passthrough")
	testutil.WaitFor(b, 10*time.Second, func() error {
		if events.Load() < n {
			return fmt.Errorf("%d of %d audit events", events.Load(), n)
		}
		return nil
	})
}

func BenchmarkMITMNewHost(b *testing.B) {
	h, _ := benchHarness(b)
	c := h.client(b, "bench", testToken)
	c.Transport.(*http.Transport).DisableKeepAlives = true
	hdr := http.Header{"Authorization": {"Bearer " + placeholder}}
	base := time.Now().UnixNano()
	run4(b, func(i int64) error {
		return fetch(c, fmt.Sprintf("https://h%d-%d.example.com/", base, i), hdr)
	})
}

// BenchmarkGoproxyBareMITM is goproxy's own MITM (its CA, no policy, no swap, no audit): the
// floor our MITM's overhead is measured against.
func BenchmarkGoproxyBareMITM(b *testing.B) {
	h, _ := benchHarness(b)
	origin := h.upstream.Listener.Addr().String()
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = goproxyLogger{zerolog.Nop()}
	gp.ConnectDial = nil
	gp.CertStore = &mapCertStore{m: map[string]*tls.Certificate{}}
	gp.OnRequest().HandleConnect(goproxy.AlwaysMitm)
	gp.Tr = &http.Transport{
		DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, origin)
		},
		TLSClientConfig: &tls.Config{RootCAs: originPool(h)}, MaxIdleConnsPerHost: 64,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: gp}
	go srv.Serve(ln)
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(goproxy.CA_CERT)
	c := &http.Client{Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()}),
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 8,
	}}
	run4(b, func(int64) error { return fetch(c, "https://api.example.com/", nil) })
}

type mapCertStore struct {
	mu sync.Mutex
	m  map[string]*tls.Certificate
}

func (s *mapCertStore) Fetch(host string, gen func() (*tls.Certificate, error)) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.m[host]; ok {
		return c, nil
	}
	c, err := gen()
	if err == nil {
		s.m[host] = c
	}
	return c, err
}

// BenchmarkMitmproxy is the peer row: mitmdump (Debian's mitmproxy) intercepting the same
// loopback origin with the same 4 keep-alive clients. Skipped when mitmdump is not installed.
func BenchmarkMitmproxy(b *testing.B) {
	bin, err := exec.LookPath("mitmdump")
	if err != nil {
		b.Skip("mitmdump not installed (apt-get install mitmproxy)")
	}
	h, _ := benchHarness(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	conf := b.TempDir()
	cmd := exec.Command(bin, "--listen-host", "127.0.0.1", "--listen-port", port, "--set", "confdir="+conf,
		"--ssl-insecure", "--quiet", "--set", "flow_detail=0")
	cmd.Env = append(os.Environ(), "HOME="+conf)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	caFile := filepath.Join(conf, "mitmproxy-ca-cert.pem")
	testutil.WaitFor(b, 30*time.Second, func() error {
		if _, err := os.Stat(caFile); err != nil {
			return err
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	})
	pem, err := os.ReadFile(caFile)
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &http.Client{Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: addr}),
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 8,
	}}
	origin := "https://" + h.upstream.Listener.Addr().String() + "/"
	run4(b, func(int64) error { return fetch(c, origin, nil) })
}
