package vmm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	gwapi "github.com/IniZio/nexus/pkg/api/gateway"
)

// whyExchange sends raw on a fresh stream of w and returns the status and body it answered.
func whyExchange(t *testing.T, w *whyServer, raw string) (int, string) {
	t.Helper()
	here, there := net.Pipe()
	done := make(chan struct{})
	go func() { defer close(done); w.serve(context.Background(), there) }()
	go func() { here.Write([]byte(raw)) }()
	_ = here.SetDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(here), nil)
	if err != nil {
		t.Fatalf("no answer to %.40q: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	here.Close()
	<-done
	return resp.StatusCode, string(b)
}

type recordedWhy struct {
	mu    sync.Mutex
	calls []gwapi.EgressWhyRequest
}

func (r *recordedWhy) call(_ context.Context, c gwapi.EgressWhyRequest) (int, any) {
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	if c.Request != nil {
		return http.StatusAccepted, agentproto.WhyAnswer{Message: "asked for " + c.Request.Host}
	}
	return http.StatusOK, agentproto.WhyReport{Sandbox: c.SandboxID, Mode: "curated", Denials: []agentproto.WhyDenial{}}
}

// nexus-why names the sandbox of its channel, whatever the guest sends, and bounds requests.
func TestWhyIdentityAndBounds(t *testing.T) {
	rec := &recordedWhy{}
	w := newWhyServer("sb-1", rec.call)
	// A guest that claims another sandbox, in a header and in the body, is still sandbox sb-1.
	body := `{"host":"docs.example.com","port":443,"reason":"sdk","sandbox_id":"sb-2","name":"default/two"}`
	raw := "POST " + agentproto.WhyRequestPath + " HTTP/1.0\r\nHost: nexus-why\r\nX-Sandbox: sb-2\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body
	if code, out := whyExchange(t, w, raw); code != http.StatusAccepted || !strings.Contains(out, "asked for docs.example.com") {
		t.Fatalf("a request: %d %s", code, out)
	}
	if code, out := whyExchange(t, w, "GET "+agentproto.WhyPath+" HTTP/1.0\r\n\r\n"); code != http.StatusOK {
		t.Fatalf("a report: %d %s", code, out)
	} else {
		var rep agentproto.WhyReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Sandbox != "sb-1" {
			t.Fatalf("report %q: %v", out, err)
		}
	}
	for _, c := range rec.calls {
		if c.SandboxID != "sb-1" {
			t.Fatalf("the gateway was asked for %+v", c)
		}
	}
	if len(rec.calls) != 2 || rec.calls[0].Request == nil || rec.calls[0].Request.Port != 443 || rec.calls[1].Request != nil {
		t.Fatalf("calls %+v", rec.calls)
	}
	// Over 1 KiB of body, an unknown path, garbage: refused without asking the gateway.
	big := `{"host":"a.example","reason":"` + strings.Repeat("x", 2000) + `"}`
	for _, raw := range []string{
		"POST " + agentproto.WhyRequestPath + " HTTP/1.0\r\nContent-Length: " + fmt.Sprint(len(big)) + "\r\n\r\n" + big,
		"GET /v1/other HTTP/1.0\r\n\r\n",
		"\x00\x01garbage\r\n\r\n",
		"GET " + agentproto.WhyPath + " HTTP/1.0\r\nX-Long: " + strings.Repeat("y", 8<<10) + "\r\n\r\n",
	} {
		if code, _ := whyExchange(t, w, raw); code != http.StatusBadRequest && code != http.StatusNotFound {
			t.Errorf("%.50q: %d", raw, code)
		}
	}
	if len(rec.calls) != 2 {
		t.Fatalf("bad calls reached the gateway: %+v", rec.calls[2:])
	}
}

// A burst of calls is answered, then one a second; a guest cannot hold more than
// maxWhyConns exchanges open.
func TestWhyRateLimit(t *testing.T) {
	rec := &recordedWhy{}
	w := newWhyServer("sb-1", rec.call)
	limited := 0
	for range whyBurst + 5 {
		if code, _ := whyExchange(t, w, "GET "+agentproto.WhyPath+" HTTP/1.0\r\n\r\n"); code == http.StatusTooManyRequests {
			limited++
		}
	}
	if len(rec.calls) > whyBurst+1 || limited < 4 {
		t.Fatalf("%d calls answered, %d limited", len(rec.calls), limited)
	}
	now := time.Now()
	b := &whyBudget{}
	for range whyBurst {
		if !b.allow(now) {
			t.Fatal("the burst was cut short")
		}
	}
	if b.allow(now) || !b.allow(now.Add(whyEvery)) || b.allow(now.Add(whyEvery)) {
		t.Fatal("the budget does not refill at one a second")
	}
	// Connections past maxWhyConns are closed at once, unanswered.
	held := make([]net.Conn, 0, maxWhyConns)
	for range maxWhyConns {
		here, there := net.Pipe()
		go w.serve(context.Background(), there)
		held = append(held, here)
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	err := waitUntil(func() bool { return len(w.sem) == maxWhyConns })
	if err != nil {
		t.Fatal(err)
	}
	here, there := net.Pipe()
	go w.serve(context.Background(), there)
	_ = here.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := here.Read(make([]byte, 1)); n != 0 || err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a fifth exchange: %d %v", n, err)
	}
}

func waitUntil(cond func() bool) error {
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("condition not met in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}
