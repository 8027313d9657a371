package netstack

import (
	"net"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
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
	v := n.judgeUDP(dst, int(id.LocalPort))
	n.emit(v.ev)
	if !v.allowed() {
		return true
	}
	return n.udpFwd.HandlePacket(id, pkt)
}

// handleUDPFlow proxies one allow-all UDP flow to its real destination.
func (n *network) handleUDPFlow(r *udp.ForwarderRequest) {
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
	if !n.track(guest, up) {
		guest.Close()
		up.Close()
		return
	}
	go func() {
		defer n.untrack(guest, up)
		defer guest.Close()
		defer up.Close()
		go func() {
			buf := make([]byte, 65535)
			for {
				_ = up.SetReadDeadline(time.Now().Add(udpIdle))
				k, err := up.Read(buf)
				if err != nil {
					guest.Close()
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
			// The flow was judged when it started; stop it once allow-all has ended.
			if v := n.judgeUDP(dst, port); !v.allowed() {
				n.emit(v.ev)
				return
			}
			if _, err := up.Write(buf[:k]); err != nil {
				return
			}
		}
	}()
}
