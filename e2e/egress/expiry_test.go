package egress_test

import (
	"encoding/json"
	"errors"
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

// TestAllowAllExpiryCutsOpenConnections: a TCP stream opened during an allow-all window ends
// when the window does, and the cut is audited as allow_all_expired.
func TestAllowAllExpiryCutsOpenConnections(t *testing.T) {
	const box = "egress/expiry"
	create(t, box, "nexus-mini", "--egress", "allow-all=60s") // room for a slow create
	var view api.EgressView
	if err := json.Unmarshal([]byte(stack.MustNexus(t, "egress", "show", box, "--json")), &view); err != nil {
		t.Fatalf("egress show --json: %v", err)
	}
	until := view.Egress.AllowAllUntil
	ip := resolveMini(t, box, plainHost)

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
	// The stream flows while the window is open.
	testutil.WaitFor(t, 30*time.Second, func() error {
		if openStreams.Load() == 0 {
			return errors.New("the stream did not reach the upstream")
		}
		return nil
	})
	if time.Now().After(until) {
		t.Fatalf("the stream started after the window closed at %s: the host is too slow for this test", until)
	}
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
}
