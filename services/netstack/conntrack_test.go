package netstack_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
)

// streamServer is a loopback TCP server that writes a line every 20ms to each connection until
// the connection breaks: a long download that only a closed connection ends.
type streamServer struct {
	addr string
	open atomic.Int32
}

func startStreamServer(t *testing.T) *streamServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &streamServer{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.open.Add(1)
			go func() {
				defer s.open.Add(-1)
				defer c.Close()
				for {
					if _, err := c.Write([]byte("tick\n")); err != nil {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
	}()
	return s
}

// udpEcho is a loopback UDP server that echoes every datagram and counts them.
func udpEcho(t *testing.T) (string, *atomic.Int32) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	var got atomic.Int32
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			got.Add(1)
			_, _ = pc.WriteTo(buf[:k], from)
		}
	}()
	return pc.LocalAddr().String(), &got
}

// stream is a guest connection reading a stream; ended is closed when its reads stop.
type stream struct {
	c     net.Conn
	lines atomic.Int64
	ended chan struct{}
}

func (e *env) openStream(t *testing.T, dst netip.AddrPort) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	c, err := e.guest.DialTCP(ctx, dst)
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	t.Cleanup(func() { c.Close() })
	s := &stream{c: c, ended: make(chan struct{})}
	go func() {
		defer close(s.ended)
		br := bufio.NewReader(c)
		for {
			if _, err := br.ReadString('\n'); err != nil {
				return
			}
			s.lines.Add(1)
		}
	}()
	s.waitLines(t, 3)
	return s
}

// waitLines waits until the stream has read n more lines.
func (s *stream) waitLines(t *testing.T, n int64) {
	t.Helper()
	want := s.lines.Load() + n
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := s.lines.Load(); got < want {
			return fmt.Errorf("stream read %d lines, want %d", got, want)
		}
		return nil
	})
}

func (s *stream) waitEnd(t *testing.T, what string) {
	t.Helper()
	testutil.WaitFor(t, 15*time.Second, func() error {
		select {
		case <-s.ended:
			return nil
		default:
			return errors.New(what + " still flowing")
		}
	})
}

func TestAllowAllExpiryClosesOpenConnections(t *testing.T) {
	st := startStreamServer(t)
	echo, echoed := udpEcho(t)
	e := newEnv(t, netstackapi.Policy{Mode: netstackapi.ModeAllowAll, AllowAllUntil: time.Now().Add(2 * time.Second)},
		map[string]string{"stream.test": st.addr, "udp.test": echo})
	s := e.openStream(t, netip.AddrPortFrom(e.lookup(t, "stream.test"), 9000))
	uc, err := e.guest.DialUDP(netip.AddrPortFrom(e.lookup(t, "udp.test"), 9001))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if _, err := uc.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = uc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if buf := make([]byte, 16); func() bool { k, err := uc.Read(buf); return err != nil || string(buf[:k]) != "ping" }() {
		t.Fatal("allow-all udp flow not echoed")
	}

	s.waitEnd(t, "tcp stream after allow-all expired")
	ev := e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Port: 9000, Decision: "deny", Rule: "allow_all_expired"})
	if ev.Host != "stream.test" || ev.Reason != "open connection closed: port 9000 is not allowed for stream.test" {
		t.Errorf("expiry event: %+v", ev)
	}
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "udp", Port: 9001, Decision: "deny", Rule: "allow_all_expired"})
	testutil.WaitFor(t, 10*time.Second, func() error {
		if k := st.open.Load(); k != 0 {
			return fmt.Errorf("%d upstream connections still open", k)
		}
		return nil
	})
	// The UDP flow is gone: a later datagram starts a new flow, which is refused.
	before := echoed.Load()
	_, _ = uc.Write([]byte("late"))
	e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "udp", Port: 9001, Decision: "deny", Reason: "udp is allowed only for dns"})
	if echoed.Load() != before {
		t.Error("a datagram reached the upstream after expiry")
	}
	if n := countRule(e.log.all(), "allow_all_expired"); n != 2 {
		t.Errorf("%d allow_all_expired events, want one per open flow (2)", n)
	}
}

func countRule(evs []audit.Event, rule string) int {
	n := 0
	for _, ev := range evs {
		if ev.Rule == rule {
			n++
		}
	}
	return n
}

func TestPolicyNarrowingClosesOpenConnections(t *testing.T) {
	st := startStreamServer(t)
	pol := netstackapi.Policy{Mode: netstackapi.ModeCurated, Allow: rules(t, "stream.test:9000", "keep.test:9000", "web.test")}
	e := newEnv(t, pol, map[string]string{"stream.test": st.addr, "keep.test": st.addr})
	cut := e.openStream(t, netip.AddrPortFrom(e.lookup(t, "stream.test"), 9000))
	kept := e.openStream(t, netip.AddrPortFrom(e.lookup(t, "keep.test"), 9000))

	// A keep-alive HTTP connection through the shim and the mitm (the CONNECT stand-in).
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	web, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(e.lookup(t, "web.test"), 80))
	if err != nil {
		t.Fatal(err)
	}
	defer web.Close()
	br := bufio.NewReader(web)
	fmt.Fprint(web, "GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello from web.test" {
		t.Fatalf("shim response %q", body)
	}
	webEnded := make(chan struct{})
	go func() { _, _ = br.ReadByte(); close(webEnded) }()

	// Widening closes nothing.
	if _, err := e.svc.UpdateNetwork(context.Background(), sandboxID, netstackapi.Policy{Mode: "curated", Allow: append(pol.Allow, rules(t, "api.test:8080")...)}); err != nil {
		t.Fatal(err)
	}
	cut.waitLines(t, 3)
	// Narrowing: stream.test and web.test are no longer allowed.
	if _, err := e.svc.UpdateNetwork(context.Background(), sandboxID, netstackapi.Policy{Mode: "curated", Allow: rules(t, "keep.test:9000")}); err != nil {
		t.Fatal(err)
	}
	cut.waitEnd(t, "stream to the removed host")
	testutil.WaitFor(t, 15*time.Second, func() error {
		select {
		case <-webEnded:
			return nil
		default:
			return errors.New("the shimmed connection to the removed host is still open")
		}
	})
	ev := e.log.waitEvent(t, audit.Event{Layer: "l4", Proto: "tcp", Host: "stream.test", Port: 9000, Decision: "deny", Rule: "policy_revoked"})
	if ev.Reason != "open connection closed: port 9000 is not allowed for stream.test" {
		t.Errorf("revoked event: %+v", ev)
	}
	e.log.waitEvent(t, audit.Event{Layer: "http", Proto: "tcp", Host: "web.test", Port: 80, Decision: "deny", Rule: "policy_revoked"})
	kept.waitLines(t, 5)
	if n := countRule(e.log.all(), "policy_revoked"); n != 2 {
		t.Errorf("%d policy_revoked events, want 2 (the still-allowed stream stays open)", n)
	}
}
