// Package fakeguest is a userspace stand-in for a sandbox guest in tests: it connects to a
// network's unix socket speaking QEMU's stream protocol (4-byte big-endian length, then an
// ethernet frame) and runs its own gvisor stack as 192.168.127.2, so tests can dial, resolve,
// send UDP and ping exactly as a guest would, without a VM.
package fakeguest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

const nicID = 1

// Options configure a guest; zero values give the sandbox defaults.
type Options struct {
	MAC        string     // default 52:54:00:12:34:56 (QEMU's default)
	IP         netip.Addr // default 192.168.127.2
	Gateway    netip.Addr // default 192.168.127.1
	GatewayMAC string     // for the static IPv6 neighbour; default 02:6e:78:00:00:01
	MTU        int        // default 1500
}

// Guest is a connected fake guest.
type Guest struct {
	opts   Options
	conn   net.Conn
	ep     *channel.Endpoint
	stack  *stack.Stack
	wmu    sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	port   atomic.Uint32
}

// IPv6Addr is the guest's IPv6 address, used only to test that IPv6 leaves nothing.
var IPv6Addr = netip.MustParseAddr("fd00::2")

var ipv6Gateway = netip.MustParseAddr("fe80::1")

// Dial connects to the network's socket and starts the guest stack.
func Dial(ctx context.Context, socketPath string, opts Options) (*Guest, error) {
	if opts.MAC == "" {
		opts.MAC = "52:54:00:12:34:56"
	}
	if !opts.IP.IsValid() {
		opts.IP = netip.MustParseAddr("192.168.127.2")
	}
	if !opts.Gateway.IsValid() {
		opts.Gateway = netip.MustParseAddr("192.168.127.1")
	}
	if opts.GatewayMAC == "" {
		opts.GatewayMAC = "02:6e:78:00:00:01"
	}
	if opts.MTU == 0 {
		opts.MTU = 1500
	}
	mac, err := net.ParseMAC(opts.MAC)
	if err != nil {
		return nil, fmt.Errorf("fakeguest: mac: %w", err)
	}
	gwMAC, err := net.ParseMAC(opts.GatewayMAC)
	if err != nil {
		return nil, fmt.Errorf("fakeguest: gateway mac: %w", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("fakeguest: dial %s: %w", socketPath, err)
	}
	ep := channel.New(4096, uint32(opts.MTU+header.EthernetMinimumSize), tcpip.LinkAddress(mac))
	st := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	g := &Guest{opts: opts, conn: conn, ep: ep, stack: st}
	fail := func(what string, terr tcpip.Error) (*Guest, error) {
		conn.Close()
		st.Close()
		return nil, fmt.Errorf("fakeguest: %s: %s", what, terr)
	}
	if terr := st.CreateNIC(nicID, ethernet.New(ep)); terr != nil {
		return fail("create nic", terr)
	}
	if terr := st.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(opts.IP.As4()), PrefixLen: 24},
	}, stack.AddressProperties{}); terr != nil {
		return fail("ipv4 address", terr)
	}
	if terr := st.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv6.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom16(IPv6Addr.As16()), PrefixLen: 64},
	}, stack.AddressProperties{}); terr != nil {
		return fail("ipv6 address", terr)
	}
	if terr := st.AddStaticNeighbor(nicID, ipv6.ProtocolNumber, tcpip.AddrFrom16(ipv6Gateway.As16()), tcpip.LinkAddress(gwMAC)); terr != nil {
		return fail("ipv6 neighbour", terr)
	}
	st.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(opts.Gateway.As4()), NIC: nicID},
		{Destination: header.IPv6EmptySubnet, Gateway: tcpip.AddrFrom16(ipv6Gateway.As16()), NIC: nicID},
	})
	sack := tcpip.TCPSACKEnabled(true)
	st.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)

	pctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	g.wg.Add(2)
	go g.sendLoop(pctx)
	go g.recvLoop()
	return g, nil
}

// sendLoop writes the stack's outbound frames to the socket.
func (g *Guest) sendLoop(ctx context.Context) {
	defer g.wg.Done()
	hdr := make([]byte, 4)
	for {
		pkt := g.ep.ReadContext(ctx)
		if pkt == nil {
			return
		}
		v := pkt.ToView()
		b := v.AsSlice()
		binary.BigEndian.PutUint32(hdr, uint32(len(b)))
		_, err := g.conn.Write(append(hdr[:4:4], b...))
		v.Release()
		pkt.DecRef()
		if err != nil {
			return
		}
	}
}

// recvLoop feeds frames from the socket to the stack.
func (g *Guest) recvLoop() {
	defer g.wg.Done()
	hdr := make([]byte, 4)
	for {
		if _, err := io.ReadFull(g.conn, hdr); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(hdr)
		if size > 65536+header.EthernetMinimumSize {
			return
		}
		frame := make([]byte, size)
		if _, err := io.ReadFull(g.conn, frame); err != nil {
			return
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
		g.ep.InjectInbound(0, pkt)
		pkt.DecRef()
	}
}

// Close disconnects the guest and stops its stack.
func (g *Guest) Close() error {
	g.once.Do(func() {
		g.cancel()
		g.conn.Close()
		g.ep.Close()
		g.stack.Close()
		g.wg.Wait()
		g.stack.Wait()
	})
	return nil
}

func fullAddr(ap netip.AddrPort) (tcpip.FullAddress, tcpip.NetworkProtocolNumber) {
	if ap.Addr().Is4() {
		return tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(ap.Addr().As4()), Port: ap.Port()}, ipv4.ProtocolNumber
	}
	return tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom16(ap.Addr().As16()), Port: ap.Port()}, ipv6.ProtocolNumber
}

// DialTCP opens a TCP connection from the guest. Source ports are taken in sequence, as Linux
// does, rather than at random as gvisor does: random reuse of a port whose previous connection
// the far side still holds in TIME_WAIT stalls the dial (gvisor drops such a SYN when no
// listener owns the port), which is not what a real guest sees.
func (g *Guest) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	fa, proto := fullAddr(dst)
	local := tcpip.FullAddress{NIC: nicID}
	if dst.Addr().Is4() {
		local.Addr = tcpip.AddrFrom4(g.opts.IP.As4())
	} else {
		local.Addr = tcpip.AddrFrom16(IPv6Addr.As16())
	}
	var err error
	for range 64 {
		local.Port = g.nextPort()
		var c *gonet.TCPConn
		c, err = gonet.DialTCPWithBind(ctx, g.stack, local, fa, proto)
		if err == nil {
			return c, nil
		}
		if !strings.Contains(err.Error(), "port is in use") {
			return nil, err
		}
	}
	return nil, err
}

const firstPort, lastPort = 32768, 60999

func (g *Guest) nextPort() uint16 {
	n := g.port.Add(1)
	return uint16(firstPort + (n-1)%(lastPort-firstPort+1))
}

// DialUDP opens a connected UDP socket from the guest.
func (g *Guest) DialUDP(dst netip.AddrPort) (net.Conn, error) {
	fa, proto := fullAddr(dst)
	return gonet.DialUDP(g.stack, nil, &fa, proto)
}

// DialUDPFrom opens a connected UDP socket from a fixed guest port (68 for a DHCP client).
func (g *Guest) DialUDPFrom(localPort uint16, dst netip.AddrPort) (net.Conn, error) {
	fa, proto := fullAddr(dst)
	local := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(g.opts.IP.As4()), Port: localPort}
	return gonet.DialUDP(g.stack, &local, &fa, proto)
}

// Exchange sends one DNS query to server over "udp" or "tcp" from the guest.
func (g *Guest) Exchange(ctx context.Context, network string, server netip.AddrPort, name string, qtype uint16) (*dns.Msg, error) {
	var c net.Conn
	var err error
	if network == "tcp" {
		c, err = g.DialTCP(ctx, server)
	} else {
		c, err = g.DialUDP(server)
	}
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	cl := &dns.Client{Net: network}
	resp, _, err := cl.ExchangeWithConnContext(ctx, m, &dns.Conn{Conn: c})
	return resp, err
}

// LookupA resolves name at the gateway over UDP and returns its A records.
func (g *Guest) LookupA(ctx context.Context, name string) ([]netip.Addr, error) {
	resp, err := g.Exchange(ctx, "udp", netip.AddrPortFrom(g.opts.Gateway, 53), name, dns.TypeA)
	if err != nil {
		return nil, err
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("lookup %s: %s", name, dns.RcodeToString[resp.Rcode])
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ip)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("lookup %s: no A records", name)
	}
	return out, nil
}

// ErrNoReply means an echo request got no reply before the context ended.
var ErrNoReply = errors.New("no echo reply")

// Ping sends one ICMP echo request to dst and waits for the reply until ctx ends.
func (g *Guest) Ping(ctx context.Context, dst netip.Addr) error {
	var wq waiter.Queue
	proto, netProto := icmp.ProtocolNumber4, ipv4.ProtocolNumber
	if dst.Is6() {
		proto, netProto = icmp.ProtocolNumber6, ipv6.ProtocolNumber
	}
	ep, terr := g.stack.NewEndpoint(proto, netProto, &wq)
	if terr != nil {
		return fmt.Errorf("ping: %s", terr)
	}
	defer ep.Close()
	fa, _ := fullAddr(netip.AddrPortFrom(dst, 0))
	if terr := ep.Connect(fa); terr != nil {
		return fmt.Errorf("ping: connect: %s", terr)
	}
	req := make([]byte, header.ICMPv4MinimumSize+8)
	if dst.Is4() {
		h := header.ICMPv4(req)
		h.SetType(header.ICMPv4Echo)
		h.SetIdent(0x4e58)
		h.SetSequence(1)
	} else {
		h := header.ICMPv6(req)
		h.SetType(header.ICMPv6EchoRequest)
	}
	copy(req[header.ICMPv4MinimumSize:], "nexusping")
	var r bytesReader
	r.b = req
	if _, terr := ep.Write(&r, tcpip.WriteOptions{}); terr != nil {
		return fmt.Errorf("ping: write: %s", terr)
	}
	we, ch := waiter.NewChannelEntry(waiter.EventIn)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)
	for {
		var out discard
		_, terr := ep.Read(&out, tcpip.ReadOptions{})
		if terr == nil {
			return nil
		}
		if _, ok := terr.(*tcpip.ErrWouldBlock); !ok {
			return fmt.Errorf("ping: read: %s", terr)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ErrNoReply
		}
	}
}

type bytesReader struct{ b []byte }

func (r *bytesReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func (r *bytesReader) Len() int { return len(r.b) }

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
