package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/IniZio/nexus/pkg/audit"
)

// handleTCP is the tcp.Forwarder hook: it runs in its own goroutine for every guest SYN.
func (n *network) handleTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst := netip.AddrFrom4(id.LocalAddress.As4())
	if id.LocalAddress.Len() != 4 {
		r.Complete(true)
		return
	}
	f := &flow{proto: "tcp", dst: dst, port: int(id.LocalPort), layer: audit.LayerL4, epoch: n.conns.begin()}
	f.names = n.namesFor(dst, time.Now())
	v := n.judgeTCP(dst, f.port, f.names)
	if !v.allowed() && v.ask {
		v = n.holdTCP(v, dst, f.port, f.names, guestSocket{"tcp", int(id.RemotePort)})
	}
	if !v.allowed() {
		n.emit(v.ev)
		r.Complete(true)
		return
	}
	if !n.admit(v) {
		r.Complete(true)
		return
	}
	defer n.release()
	if v.shim {
		f.shim = true
		n.serveShim(r, v, f)
		return
	}
	n.serveDirect(r, v, f)
}

// serveDirect dials the upstream first, so that a refused or unreachable upstream is a RST to
// the guest, then completes the guest handshake and splices.
func (n *network) serveDirect(r *tcp.ForwarderRequest, v verdict, f *flow) {
	ctx, cancel := context.WithTimeout(n.ctx, n.svc.cfg.DialTimeout)
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", v.target)
	cancel()
	if err != nil {
		v.ev.Reason += "; upstream dial failed: " + dialErrText(err)
		n.emit(v.ev)
		r.Complete(true)
		return
	}
	guest, err := acceptGuest(r)
	if err != nil {
		up.Close()
		v.ev.Reason += "; guest handshake failed"
		n.emit(v.ev)
		return
	}
	n.emit(v.ev)
	n.splice(guest, up, f)
}

// acceptGuest completes the guest's handshake.
func acceptGuest(r *tcp.ForwarderRequest) (*guestConn, error) {
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	r.Complete(false)
	if terr != nil {
		return nil, errors.New(terr.String())
	}
	ep.SocketOptions().SetKeepAlive(true)
	return &guestConn{TCPConn: gonet.NewTCPConn(&wq, ep), ep: ep}, nil
}

// guestConn is the guest side of a proxied connection; abort resets it.
type guestConn struct {
	*gonet.TCPConn
	ep tcpip.Endpoint
}

func (g *guestConn) abort() { g.ep.Abort() }

// splice registers f in the connection table and copies both ways until both directions are
// done, propagating half-closes.
func (n *network) splice(guest *guestConn, up net.Conn, f *flow) {
	f.closers, f.cut = []io.Closer{guest, up}, guest.abort
	if !n.register(f) {
		return
	}
	defer n.unregister(f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.CopyBuffer(egressWriter{n, countingWriter{up, &f.bytes}}, guest, make([]byte, 64<<10))
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			up.Close()
		}
	}()
	_, err := io.CopyBuffer(ingressWriter{n, guest}, up, make([]byte, 64<<10))
	if err != nil && errors.Is(err, syscall.ECONNRESET) {
		guest.abort()
	} else {
		_ = guest.CloseWrite()
	}
	<-done
	guest.Close()
	up.Close()
}

// dialErrText is the short, secret-free cause of a failed dial.
func dialErrText(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	var se *syscall.Errno
	if errors.As(err, &se) {
		return se.Error()
	}
	return err.Error()
}

// denyEvent turns an allow verdict into a deny with reason.
func denyEvent(ev audit.Event, reason string) audit.Event {
	ev.Decision, ev.Reason = audit.Deny, reason
	return ev
}
