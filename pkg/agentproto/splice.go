package agentproto

import (
	"io"
	"net"
	"sync"

	"github.com/hashicorp/yamux"
)

// Splice copies bytes both ways between a and b until both directions end, propagating a
// half-close (EOF one way closes the write side of the other), then closes both.
func Splice(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	one := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if err != nil {
			// A broken direction ends both: unblock the other copy.
			a.Close()
			b.Close()
			return
		}
		closeWrite(dst)
	}
	go one(a, b)
	go one(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// closeWrite half-closes c: CloseWrite on sockets, Close on a yamux stream (a yamux Close only
// sends FIN; the stream stays readable until the peer closes too).
func closeWrite(c net.Conn) {
	switch c := c.(type) {
	case interface{ CloseWrite() error }:
		c.CloseWrite()
	case *yamux.Stream:
		c.Close()
	}
}
