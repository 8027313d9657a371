package netstack

import (
	"io"
	"net"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/IniZio/nexus/pkg/audit"
)

// udpIdle closes an allow-all UDP flow after this long without traffic.
const udpIdle = 60 * time.Second

// handleUDP judges every datagram that no gateway service (DNS, DHCP) took. Denied datagrams are
// dropped. Allowed ones (allow-all only) start a flow: later datagrams of the flow go straight to
// its endpoint, so a flow is audited once, when it starts.
func (n *network) handleUDP(id stack.TransportEndpointID, pkt *stack.PacketBuffer) bool {
	if id.LocalAddress.Len() != 4 {
		return true
	}
	dst := netip.AddrFrom4(id.LocalAddress.As4())
	v := n.judgeUDP(dst, int(id.LocalPort), n.namesFor(dst, time.Now()))
	if !v.allowed() {
		n.emit(v.ev)
		return true
	}
	if !n.admit(v) {
		return true
	}
	n.emit(v.ev)
	return n.udpFwd.HandlePacket(id, pkt) // handleUDPFlow runs now and owns the admitted slot
}

// handleUDPFlow proxies one allow-all UDP flow to its real destination; it releases the slot
// handleUDP admitted when the flow ends.
func (n *network) handleUDPFlow(r *udp.ForwarderRequest) {
	started := false
	defer func() {
		if !started {
			n.release()
		}
	}()
	id := r.ID()
	dst := netip.AddrFrom4(id.LocalAddress.As4())
	port := int(id.LocalPort)
	target := n.svc.overrides.target(dst, port)
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		return
	}
	guest := gonet.NewUDPConn(&wq, ep)
	up, err := net.Dial("udp", target)
	if err != nil {
		guest.Close()
		return
	}
	// The datagram was judged before this flow began, so register judges it once more.
	f := &flow{proto: "udp", dst: dst, port: port, layer: audit.LayerL4, epoch: ^uint64(0),
		names: n.namesFor(dst, time.Now()), closers: []io.Closer{guest, up}}
	if !n.register(f) {
		return
	}
	started = true
	go func() {
		defer n.release()
		defer n.unregister(f)
		defer f.close()
		go func() {
			buf := make([]byte, 65535)
			for {
				_ = up.SetReadDeadline(time.Now().Add(udpIdle))
				k, err := up.Read(buf)
				if err != nil {
					guest.Close()
					return
				}
				if err := n.waitIngress(k, "udp"); err != nil {
					return
				}
				if _, err := guest.Write(buf[:k]); err != nil {
					return
				}
			}
		}()
		buf := make([]byte, 65535)
		for {
			_ = guest.SetReadDeadline(time.Now().Add(udpIdle))
			k, err := guest.Read(buf)
			if err != nil {
				return
			}
			f.bytes.Add(int64(k))
			if err := n.waitEgress(k, "udp"); err != nil {
				return
			}
			if _, err := up.Write(buf[:k]); err != nil {
				return
			}
		}
	}()
}
