package mitm

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/IniZio/nexus/pkg/audit"
)

const bigBody = 200 << 20

// zeroReader yields n zero bytes without holding them.
type zeroReader struct{ n int64 }

func (z *zeroReader) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

// heapWatch samples the heap until stopped and returns the peak.
func heapWatch() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(done); wg.Wait(); return peak.Load() }
}

// TestStreamingBigBodies moves 200 MB up (chunked, unknown length) and 200 MB down through the
// MITM while the heap stays far below the body size: nothing is buffered whole.
func TestStreamingBigBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 400 MB")
	}
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			fmt.Fprintf(w, "%d", n)
		case "/download":
			io.Copy(w, &zeroReader{n: bigBody}) // no Content-Length: chunked
		}
	})
	h := newHarness(t, up)
	c := h.client(t, testSandbox, testToken)
	runtime.GC()
	stop := heapWatch()

	req, _ := http.NewRequest("POST", "https://api.example.com/upload", io.NopCloser(&zeroReader{n: bigBody}))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != strconv.Itoa(bigBody) {
		t.Fatalf("upstream received %s bytes, want %d", b, bigBody)
	}

	resp, err = c.Get("https://api.example.com/download")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != bigBody {
		t.Fatalf("downloaded %d bytes (%v), want %d", n, err, bigBody)
	}
	peak := stop()
	t.Logf("peak heap in use while streaming 2×200 MB: %.1f MiB", float64(peak)/(1<<20))
	if peak > 64<<20 {
		t.Fatalf("peak heap %.1f MiB: bodies are being buffered", float64(peak)/(1<<20))
	}
	ev := h.waitEvent(t, func(ev audit.Event) bool { return ev.Path == "/upload" })
	if ev.Bytes < bigBody {
		t.Fatalf("upload event counts %d bytes", ev.Bytes)
	}
	ev = h.waitEvent(t, func(ev audit.Event) bool { return ev.Path == "/download" })
	if ev.Bytes != bigBody {
		t.Fatalf("download event counts %d bytes", ev.Bytes)
	}
}

func TestWebSocketThroughMITM(t *testing.T) {
	upgrader := websocket.Upgrader{}
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+realToken {
			http.Error(w, "no token", 401)
			return
		}
		c, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			mt, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			c.WriteMessage(mt, append([]byte("echo:"), msg...))
		}
	})
	h := newHarness(t, up)
	d := websocket.Dialer{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: h.addr, User: url.UserPassword(testSandbox, testToken)}),
		TLSClientConfig: &tls.Config{RootCAs: h.caPool(t)},
	}
	hdr := http.Header{"Authorization": {"Bearer " + placeholder}}
	ws, resp, err := d.Dial("wss://api.example.com/ws", hdr)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial: %v (status %d)", err, status)
	}
	defer ws.Close()
	for i := 0; i < 3; i++ {
		msg := fmt.Sprintf("hello %d", i)
		if err := ws.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := ws.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "echo:"+msg {
			t.Fatalf("got %q", got)
		}
	}
	ev := h.waitEvent(t, func(ev audit.Event) bool { return ev.Path == "/ws" })
	if ev.Status != http.StatusSwitchingProtocols || !ev.Swapped {
		t.Fatalf("event %+v", ev)
	}
}

func TestCAPersistedAndPrivate(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key mode %v, want 0600", st.Mode().Perm())
	}
	if st, _ := os.Stat(filepath.Join(dir, CACertFile)); st.Mode().Perm()&0o044 == 0 {
		t.Fatalf("CA cert mode %v should be readable", st.Mode().Perm())
	}
	b, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if string(a.CertPEM()) != string(b.CertPEM()) {
		t.Fatal("a restart generated a new CA")
	}
	cert := b.Certificate()
	if !cert.IsCA || cert.PublicKeyAlgorithm != x509.ECDSA {
		t.Fatalf("CA: IsCA=%v alg=%v", cert.IsCA, cert.PublicKeyAlgorithm)
	}
	// A leaf from the reloaded CA verifies against the persisted certificate.
	leaf, err := newLeafCache(b, 4).get("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(a.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool}); err != nil {
		t.Fatal(err)
	}
	if leaf.Leaf.PublicKeyAlgorithm != x509.ECDSA {
		t.Fatal("leaf is not ECDSA")
	}
	// A key made world-readable is tightened on load.
	os.Chmod(filepath.Join(dir, CAKeyFile), 0o644)
	if _, err := LoadOrCreateCA(dir); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(dir, CAKeyFile)); st.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v after reload", st.Mode().Perm())
	}
}

func TestLeafCacheSingleflightAndLRU(t *testing.T) {
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := newLeafCache(ca, 2)
	var wg sync.WaitGroup
	certs := make([]*tls.Certificate, 32)
	for i := range certs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			certs[i], _ = c.get("a.example.com")
		}()
	}
	wg.Wait()
	for _, x := range certs {
		if x != certs[0] || x == nil {
			t.Fatal("concurrent misses minted different leaves")
		}
	}
	if _, mints := c.stats(); mints != 1 {
		t.Fatalf("%d mints for one host, want 1", mints)
	}
	c.get("b.example.com")
	c.get("a.example.com") // a is now most recent
	c.get("c.example.com") // evicts b
	if size, _ := c.stats(); size != 2 {
		t.Fatalf("cache size %d, want 2", size)
	}
	c.get("a.example.com")
	if _, mints := c.stats(); mints != 3 {
		t.Fatalf("%d mints, want 3 (a must still be cached)", mints)
	}
	c.get("b.example.com")
	if _, mints := c.stats(); mints != 4 {
		t.Fatalf("%d mints, want 4 (b was evicted)", mints)
	}
	// IP literals get an IP SAN.
	ipLeaf, err := c.get("127.0.0.1")
	if err != nil || len(ipLeaf.Leaf.IPAddresses) != 1 {
		t.Fatalf("ip leaf: %v", err)
	}
}
