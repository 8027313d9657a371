package egress_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/audit"
)

// openStreams counts /stream responses being written by the fake upstreams.
var openStreams atomic.Int32

// serveStream writes a line every 100ms until a write fails: a download that only a closed
// connection ends. (The request context is no signal: busybox nc half-closes after its stdin,
// which the server takes for a client gone.)
func serveStream(w http.ResponseWriter, _ *http.Request) {
	openStreams.Add(1)
	defer openStreams.Add(-1)
	fl, _ := w.(http.Flusher)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := w.Write([]byte("tick\n")); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
		<-t.C
	}
}

// TestAllowAll: allow-all lets anything out (no MITM) until its expiry, then the sandbox is
// default-deny, and a TCP stream opened during the window ends when the window does, the cut
// audited as allow_all_expired. (One sandbox and one window for both: the window is most of
// the test's time.)
func TestAllowAll(t *testing.T) {
	const box = "egress/open"
	const window = 45 * time.Second // room for a slow create on a loaded machine before the window closes
	start := time.Now()
	create(t, box, "nexus-mini", "--egress", "allow-all=45s")
	var view api.EgressView
	if err := json.Unmarshal([]byte(stack.MustNexus(t, "egress", "show", box, "--json")), &view); err != nil {
		t.Fatalf("egress show --json: %v", err)
	}
	until := view.Egress.AllowAllUntil
	ip := resolveMini(t, box, plainHost)

	// A stream opened while the window is open, which only a closed connection ends.
	type result struct {
		out, errOut string
		code        int
		at          time.Time
	}
	done := make(chan result, 1)
	go func() {
		out, errOut, code := sh(t, box, `printf 'GET /stream HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc `+ip+` 8123 > /tmp/stream; wc -l < /tmp/stream`)
		done <- result{out, errOut, code, time.Now()}
	}()
	testutil.WaitFor(t, 30*time.Second, func() error {
		if openStreams.Load() == 0 {
			return errors.New("the stream did not reach the upstream")
		}
		return nil
	})
	if time.Now().After(until) {
		t.Fatalf("the stream started after the window closed at %s: the host is too slow for this test", until)
	}

	installProbe(t, box)
	show := stack.MustNexus(t, "egress", "show", box)
	if !strings.Contains(show, "mode:     allow-all") || !strings.Contains(show, "(active)") {
		t.Fatalf("egress show:\n%s", show)
	}
	// Any port, any name, UDP too.
	out := mustSh(t, box, `printf 'GET /open HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc -w 5 `+ip+` 8123`)
	if !strings.Contains(out, "hello from fake example.test") {
		t.Fatalf("allow-all tcp: %q", out)
	}
	if out := mustSh(t, box, "probe udp "+ip+":5999 udp-open"); !strings.Contains(out, "pong udp-open") || !udpSeen.got("udp-open") {
		t.Fatalf("allow-all udp: %q", out)
	}
	waitEvent(t, box, false, "allow-all tcp", func(e audit.Event) bool {
		return e.Layer == audit.LayerL4 && e.Proto == "tcp" && e.Port == 8123 && e.Rule == "allow-all" && e.Decision == audit.Allow
	})
	// Open internet, but never the LAN or the metadata service (private_test.go).
	t.Run("private addresses", func(t *testing.T) { privateRefusedInAllowAll(t, box) })
	if time.Now().After(until) {
		t.Fatalf("the window closed at %s before its checks ended: the host is too slow for this test", until)
	}

	// Then it expires: the open stream is cut, and new connections are refused, not early.
	var res result
	testutil.WaitFor(t, time.Until(until)+60*time.Second, func() error {
		select {
		case res = <-done:
			return nil
		default:
			return errors.New("the stream still flows after allow-all expired")
		}
	})
	lines, _ := strconv.Atoi(strings.TrimSpace(res.out))
	if lines == 0 || res.at.Before(until) {
		t.Fatalf("stream ended at %s (window until %s) after %d lines: %q %q", res.at.Format(time.RFC3339Nano), until.Format(time.RFC3339Nano), lines, res.out, res.errOut)
	}
	ev := waitEvent(t, box, true, "allow_all_expired", func(e audit.Event) bool {
		return e.Rule == "allow_all_expired" && e.Layer == audit.LayerL4 && e.Proto == "tcp" && e.Port == 8123
	})
	if ev.Host != plainHost || !strings.HasPrefix(ev.Reason, "open connection closed: ") {
		t.Errorf("expiry event: %+v", ev)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if k := openStreams.Load(); k != 0 {
			return errors.New("the upstream side of the stream is still open")
		}
		return nil
	})
	t.Logf("stream of %d lines closed %.2fs after the window ended (guest saw the end %.2fs after)", lines, ev.Time.Sub(until).Seconds(), res.at.Sub(until).Seconds())

	var expiredAt time.Time
	err := testutil.Poll(2*window, func() error {
		if _, _, code := sh(t, box, `printf 'GET /open-poll HTTP/1.0\r\n\r\n' | nc -w 3 `+ip+` 8123`); code == 0 {
			return fmt.Errorf("still open")
		}
		expiredAt = time.Now()
		return nil
	})
	if err != nil {
		t.Fatalf("allow-all did not expire within %s of its start", 2*window)
	}
	if expiredAt.Sub(start) < window {
		t.Fatalf("allow-all ended after %s, before its %s window", expiredAt.Sub(start), window)
	}
	t.Logf("allow-all=45s refused connections %.1fs after create began", expiredAt.Sub(start).Seconds())
	if _, _, code := sh(t, box, "nslookup example.test"); code == 0 {
		t.Error("after expiry a name still resolves")
	}
	if out, _, code := sh(t, box, "probe udp "+ip+":5999 udp-late"); code == 0 || udpSeen.got("udp-late") {
		t.Errorf("after expiry udp still passes: %q", out)
	}
	ev = waitEvent(t, box, true, "denial after expiry", func(e audit.Event) bool {
		return e.Layer == audit.LayerL4 && e.Proto == "tcp" && e.Port == 8123 && e.Rule != "allow_all_expired"
	})
	if ev.Host != "example.test" || !strings.HasPrefix(ev.Reason, "port 8123 is not allowed for example.test") {
		t.Errorf("after expiry: %+v", ev)
	}
	if show := stack.MustNexus(t, "egress", "show", box); !strings.Contains(show, "expired: default-deny") {
		t.Errorf("egress show after expiry:\n%s", show)
	}
}
