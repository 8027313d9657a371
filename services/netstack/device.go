package netstack

import (
	"net/netip"

	"github.com/containers/gvisor-tap-vsock/pkg/tap"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/IniZio/nexus/pkg/audit"
)

// gatewayDevice sits between the switch and the gateway's link endpoint. It judges what the
// transport forwarders never see: ICMP echo (gvisor answers echoes itself, for every address in
// promiscuous mode) and IPv6, which this stack does not speak.
type gatewayDevice struct {
	*tap.LinkEndpoint
	n *network
}

var _ tap.VirtualDevice = (*gatewayDevice)(nil)

func (d *gatewayDevice) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	switch proto {
	case header.IPv4ProtocolNumber:
		if !d.n.filterIPv4(pkt) {
			return
		}
	case header.IPv6ProtocolNumber:
		d.n.judgeIPv6(pkt)
		return
	}
	d.LinkEndpoint.DeliverNetworkPacket(proto, pkt)
}

// filterIPv4 judges ICMP echo requests; everything else goes on to the stack.
func (n *network) filterIPv4(pkt *stack.PacketBuffer) bool {
	b, ok := pkt.Data().PullUp(min(pkt.Data().Size(), header.IPv4MaximumHeaderSize+header.ICMPv4MinimumSize))
	if !ok || len(b) < header.IPv4MinimumSize {
		return true
	}
	ip := header.IPv4(b)
	if ip.TransportProtocol() != header.ICMPv4ProtocolNumber || ip.FragmentOffset() != 0 {
		return true
	}
	hl := int(ip.HeaderLength())
	if hl < header.IPv4MinimumSize || len(b) < hl+header.ICMPv4MinimumSize {
		return true
	}
	if header.ICMPv4(b[hl:]).Type() != header.ICMPv4Echo {
		return true
	}
	dst := netip.AddrFrom4(ip.DestinationAddress().As4())
	return n.judgeICMP(dst)
}

// judgeIPv6 audits IPv6 connection attempts (TCP SYN, UDP, ICMPv6 echo) as denied. Neighbour
// discovery and MLD chatter are dropped silently. Nothing IPv6 is ever forwarded.
func (n *network) judgeIPv6(pkt *stack.PacketBuffer) {
	b, ok := pkt.Data().PullUp(min(pkt.Data().Size(), header.IPv6MinimumSize+header.TCPMinimumSize))
	if !ok || len(b) < header.IPv6MinimumSize+4 {
		return
	}
	ip := header.IPv6(b)
	dst := netip.AddrFrom16(ip.DestinationAddress().As16())
	l4 := b[header.IPv6MinimumSize:]
	ev := audit.Event{Layer: audit.LayerL4, IP: dst.String(), Decision: audit.Deny, Reason: "ipv6 is not supported: the sandbox network is IPv4 only"}
	switch ip.TransportProtocol() {
	case header.TCPProtocolNumber:
		if len(l4) < header.TCPMinimumSize {
			return
		}
		t := header.TCP(l4)
		if !t.Flags().Contains(header.TCPFlagSyn) || t.Flags().Contains(header.TCPFlagAck) {
			return
		}
		ev.Proto, ev.Port = "tcp", int(t.DestinationPort())
	case header.UDPProtocolNumber:
		if len(l4) < header.UDPMinimumSize {
			return
		}
		ev.Proto, ev.Port = "udp", int(header.UDP(l4).DestinationPort())
	case header.ICMPv6ProtocolNumber:
		if header.ICMPv6(l4).Type() != header.ICMPv6EchoRequest {
			return
		}
		ev.Proto = "icmp"
	default:
		return
	}
	n.emit(ev)
}
