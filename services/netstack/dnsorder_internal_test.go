package netstack

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"
)

// orderPair is a guest socket sending queries to an orderedConn on loopback.
func orderPair(t *testing.T) (*orderedConn, *net.UDPConn) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	guest, err := net.DialUDP("udp", nil, pc.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { guest.Close() })
	return newOrderedConn(pc), guest
}

func query(id uint16) []byte {
	b := make([]byte, 12)
	binary.BigEndian.PutUint16(b, id)
	return b
}

func readQuery(t *testing.T, c *orderedConn) net.Addr {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	_, addr, err := c.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// A query that never gets an answer (miekg/dns drops some datagrams without calling the
// handler) must not hold the answer to a later query with its source and ID for ever.
func TestOrderedConnUnansweredQueryDoesNotBlockTheNext(t *testing.T) {
	c, guest := orderPair(t)
	guest.Write(query(7))
	guest.Write(query(7))
	readQuery(t, c) // dropped: never answered
	second := readQuery(t, c)
	done := make(chan error, 1)
	go func() { _, err := c.WriteTo([]byte("answer"), second); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(orderWait + 10*time.Second):
		t.Fatal("the answer waited for a query that was never answered")
	}
	guest.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	if n, err := guest.Read(buf); err != nil || string(buf[:n]) != "answer" {
		t.Fatalf("guest read %q, %v", buf[:n], err)
	}
}

// However many queries a guest leaves unanswered, the conn tracks at most maxTurns of them.
func TestOrderedConnTracksBoundedTurns(t *testing.T) {
	c, guest := orderPair(t)
	for i := range maxTurns + 50 {
		if _, err := guest.Write(query(uint16(i))); err != nil {
			t.Fatal(err)
		}
		readQuery(t, c)
	}
	c.mu.Lock()
	n := len(c.last)
	c.mu.Unlock()
	if n > maxTurns {
		t.Fatalf("%d unanswered queries tracked, more than %d", n, maxTurns)
	}
	if n < maxTurns {
		t.Fatal(fmt.Sprintf("only %d of %d distinct queries tracked", n, maxTurns))
	}
}
