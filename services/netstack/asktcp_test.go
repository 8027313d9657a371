package netstack_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/services/netstack"
)

// askTCPEnv is an ask-mode network that allows api.test on port 8080 only.
func askTCPEnv(t *testing.T, hold time.Duration) (*env, netstackapi.Policy, netip.Addr) {
	t.Helper()
	pol := netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rules(t, "api.test:8080"), Ask: true}
	e := newEnvConfig(t, pol, func(c *netstack.ManagerConfig) { c.AskHoldTCP = hold })
	return e, pol, e.lookup(t, "api.test")
}

// nextRequest waits for the network to report a held request.
func (e *env) nextRequest(t *testing.T) netstackapi.EgressRequest {
	t.Helper()
	select {
	case r := <-e.requests:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no request was reported")
	}
	return netstackapi.EgressRequest{}
}

func (e *env) update(t *testing.T, p netstackapi.Policy) {
	t.Helper()
	if _, err := e.svc.UpdateNetwork(context.Background(), sandboxID, p); err != nil {
		t.Fatal(err)
	}
}

// Ask mode holds a connection to a port not allowed: its handshake waits; approved meanwhile,
// it completes and reaches the upstream.
func TestAskHoldsTCPUntilApproved(t *testing.T) {
	e, pol, ip := askTCPEnv(t, 20*time.Second)
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
		defer cancel()
		c, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(ip, 9090))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		body, err := roundTrip(c, "api.test")
		done <- result{body, err}
	}()
	if r := e.nextRequest(t); r.Host != "api.test" || r.Port != 9090 || r.SandboxID != sandboxID || r.Proto != "tcp" || r.SrcPort == 0 {
		t.Fatalf("request %+v", r)
	}
	select {
	case r := <-done:
		t.Fatalf("a held connection ended before an answer: %+v", r)
	default:
	}
	approved := pol
	approved.Allow = rules(t, "api.test:8080", "api.test:9090")
	approved.Pending = []string{netstackapi.PendingKey("api.test", 9090)}
	approvedAt := time.Now()
	e.update(t, approved)
	if r := <-done; r.err != nil || r.body != "hello from api.test" {
		t.Fatalf("the approved connection: %q %v", r.body, r.err)
	}
	t.Logf("the held connection answered %v after the approval", time.Since(approvedAt).Round(time.Millisecond))
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Host: "api.test", Port: 9090, Decision: "allow", Rule: "api.test:9090"})
}

// A held connection whose request is rejected is refused at once (before its hold ends),
// audited ask_rejected; one nobody answers is refused when the hold ends, audited ask_timeout.
func TestAskTCPRejectedOrTimedOut(t *testing.T) {
	e, pol, ip := askTCPEnv(t, 3*time.Second)
	dial := func(port int) chan error {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
			defer cancel()
			c, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(ip, uint16(port)))
			if err == nil {
				c.Close()
				err = fmt.Errorf("connected")
			} else {
				err = nil
			}
			done <- err
		}()
		return done
	}

	done := dial(9091)
	e.nextRequest(t)
	noted := pol
	noted.Pending = []string{netstackapi.PendingKey("api.test", 9091)}
	e.update(t, noted) // the gateway recorded the request
	e.update(t, pol)   // and a person rejected it
	if err := <-done; err != nil {
		t.Fatal("a rejected connection", err)
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Host: "api.test", Port: 9091, Decision: "deny", Rule: "ask_rejected",
		Reason: "held for approval, the request was rejected"})

	done = dial(9092)
	e.nextRequest(t)
	if err := <-done; err != nil {
		t.Fatal("an unanswered connection", err)
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Host: "api.test", Port: 9092, Decision: "deny", Rule: "ask_timeout",
		Reason: "port 9092 is not allowed for api.test; held for approval, none came in time"})
}

// At most MaxHeldConns connections are held; the next is refused at once, audited
// ask_held_limit, and is not reported as a request.
func TestAskTCPHeldBound(t *testing.T) {
	e, _, ip := askTCPEnv(t, 30*time.Second)
	ctx, cancel := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range netstack.MaxHeldConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(ip, uint16(10000+i))); err == nil {
				c.Close()
			}
		}()
	}
	for range netstack.MaxHeldConns {
		e.nextRequest(t)
	}
	dctx, dcancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer dcancel()
	if c, err := e.guest.DialTCP(dctx, netip.AddrPortFrom(ip, 11000)); err == nil {
		c.Close()
		t.Fatal("a connection past the bound was let through")
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Port: 11000, Decision: "deny", Rule: "ask_held_limit"})
	select {
	case r := <-e.requests:
		t.Fatalf("a connection past the bound was reported: %+v", r)
	default:
	}
}
