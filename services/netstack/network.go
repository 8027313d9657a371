package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containers/gvisor-tap-vsock/pkg/services/dhcp"
	"github.com/containers/gvisor-tap-vsock/pkg/tap"
	"github.com/containers/gvisor-tap-vsock/pkg/types"
	"github.com/miekg/dns"
	"github.com/rs/zerolog"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/policy"
)

const nicID = 1

// timeWait is the TIME_WAIT duration of the gateway stack (see buildStack).
const timeWait = 500 * time.Millisecond

// maxPendingSYN bounds connection attempts being judged or dialled at once per sandbox; beyond it
// SYNs are dropped (the guest retransmits).
const maxPendingSYN = 256

var gatewayAddr = netip.MustParseAddr(GatewayIP)

// network is one sandbox's network.
type network struct {
	svc        *Manager
	id, name   string
	socketPath string
	token      string
	log        zerolog.Logger
	ctx        context.Context
	cancel     context.CancelFunc

	polMu sync.RWMutex
	pol   Policy
	allow *policy.Allowlist

	table           *dnsTable
	allowed, denied atomic.Uint64

	ln     net.Listener
	sw     *tap.Switch
	stack  *stack.Stack
	udpFwd *udp.Forwarder
	dnsUDP *orderedConn
	dnsSrv []*dns.Server
	dhcp   *dhcp.Server

	held     askHeld               // DNS queries and connections held for approval (ask.go)
	holds    map[*askWait]struct{} // the holds, woken by setPolicy (guarded by polMu)
	conns    *conntrack            // forwarded flows, judged again when the policy changes
	budget   *budget               // egress limits
	expiryMu sync.Mutex
	expiry   *time.Timer // sweeps conns when allow-all ends

	connMu   sync.Mutex
	guest    net.Conn // QEMU's current connection
	closed   bool
	closeErr error
	wg       sync.WaitGroup
}

func newNetwork(s *Manager, spec Spec, pol Policy, allow *policy.Allowlist) (_ *network, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	n := &network{
		svc:        s,
		id:         spec.SandboxID,
		name:       spec.SandboxName,
		socketPath: spec.SocketPath,
		token:      spec.ProxyToken,
		log:        s.log.With().Str(logSandbox, spec.SandboxID).Logger(),
		ctx:        ctx,
		cancel:     cancel,
		holds:      map[*askWait]struct{}{},
		pol:        pol,
		allow:      allow,
		table:      newDNSTable(),
		conns:      newConntrack(),
		budget:     newBudget(spec.Limits),
	}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	if err := n.buildStack(spec.GuestMAC); err != nil {
		return nil, err
	}
	n.armExpiry(pol)
	if spec.Dial {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.dialLoop()
		}()
		return n, nil
	}
	if err := n.listen(); err != nil {
		return nil, err
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.acceptLoop()
	}()
	return n, nil
}

// dialLoop connects to the socket QEMU listens on (-netdev stream,server=on) and attaches the
// guest, again and again: QEMU accepts a new connection after the old one ends, so a restarted
// netstack, or a guest rebooted by stop/start, is attached again without help.
func (n *network) dialLoop() {
	wait := 20 * time.Millisecond
	for n.ctx.Err() == nil {
		var d net.Dialer
		dctx, cancel := context.WithTimeout(n.ctx, time.Second)
		c, err := d.DialContext(dctx, "unix", n.socketPath)
		cancel()
		if err != nil {
			select {
			case <-n.ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 500*time.Millisecond)
			continue
		}
		wait = 20 * time.Millisecond
		n.connMu.Lock()
		if n.closed {
			n.connMu.Unlock()
			c.Close()
			return
		}
		n.guest = c
		n.connMu.Unlock()
		n.log.Info().Msg("guest attached")
		err = n.sw.Accept(n.ctx, c, types.QemuProtocol)
		n.connMu.Lock()
		if n.guest == c {
			n.guest = nil
		}
		n.connMu.Unlock()
		c.Close()
		n.log.Info().AnErr("reason", err).Msg("guest detached")
	}
}

func (n *network) buildStack(guestMAC string) error {
	cfg := n.svc.cfg
	link, err := tap.NewLinkEndpoint(false, uint32(cfg.MTU), GatewayMAC, GatewayIP, nil)
	if err != nil {
		return fmt.Errorf("link endpoint: %w", err)
	}
	n.sw = tap.NewSwitch(false)
	link.Connect(n.sw)
	n.sw.Connect(&gatewayDevice{LinkEndpoint: link, n: n})

	st := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	n.stack = st
	if terr := st.CreateNIC(nicID, link); terr != nil {
		return fmt.Errorf("create nic: %s", terr)
	}
	if terr := st.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddrFrom4(gatewayAddr.As4()).WithPrefix(),
	}, stack.AddressProperties{}); terr != nil {
		return fmt.Errorf("gateway address: %s", terr)
	}
	// Promiscuous + spoofing: the gateway answers for every destination the guest addresses, so
	// the forwarders see every flow.
	st.SetPromiscuousMode(nicID, true)
	st.SetSpoofing(nicID, true)
	subnet, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{192, 168, 127, 0}), tcpip.MaskFromBytes([]byte{255, 255, 255, 0}))
	st.SetRouteTable([]tcpip.Route{{Destination: subnet, NIC: nicID}})
	sack := tcpip.TCPSACKEnabled(true)
	st.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	// Gateway-side endpoints that close first sit in TIME_WAIT, and gvisor drops a new SYN for a
	// TIME_WAIT 4-tuple unless a listener owns the port (the forwarder is not one): a guest that
	// reuses the source port would hang until TIME_WAIT ends. The virtual link neither reorders
	// nor delays, so a short TIME_WAIT is safe.
	tw := tcpip.TCPTimeWaitTimeoutOption(timeWait)
	st.SetTransportProtocolOption(tcp.ProtocolNumber, &tw)

	tcpFwd := tcp.NewForwarder(st, 0, maxPendingSYN, n.handleTCP)
	st.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	n.udpFwd = udp.NewForwarder(st, n.handleUDPFlow)
	st.SetTransportProtocolHandler(udp.ProtocolNumber, n.handleUDP)

	if err := n.startDNS(); err != nil {
		return err
	}

	// DHCP for guests that ask; the guest agent normally configures GuestIP statically.
	_, ipnet, _ := net.ParseCIDR(Subnet)
	pool := tap.NewIPPool(ipnet)
	pool.Reserve(net.ParseIP(GatewayIP), GatewayMAC)
	if guestMAC != "" {
		if _, err := net.ParseMAC(guestMAC); err != nil {
			return fmt.Errorf("guest mac %q: %w", guestMAC, err)
		}
		pool.Reserve(net.ParseIP(GuestIP), guestMAC)
	}
	d, err := dhcp.New(&types.Configuration{
		MTU: cfg.MTU, Subnet: Subnet, GatewayIP: GatewayIP, GatewayMacAddress: GatewayMAC,
	}, st, pool)
	if err != nil {
		return fmt.Errorf("dhcp: %w", err)
	}
	n.dhcp = d
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		_ = d.Serve()
	}()
	return nil
}

func (n *network) startDNS() error {
	gw := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(gatewayAddr.As4()), Port: 53}
	uc, err := gonet.DialUDP(n.stack, &gw, nil, ipv4.ProtocolNumber)
	if err != nil {
		return fmt.Errorf("dns udp listener: %w", err)
	}
	tl, err := gonet.ListenTCP(n.stack, gw, ipv4.ProtocolNumber)
	if err != nil {
		uc.Close()
		return fmt.Errorf("dns tcp listener: %w", err)
	}
	h := dns.HandlerFunc(n.serveDNS)
	n.dnsUDP = newOrderedConn(uc)
	n.dnsSrv = []*dns.Server{
		{PacketConn: n.dnsUDP, Handler: h, UDPSize: 1232},
		{Listener: tl, Handler: h, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, MaxTCPQueries: 64},
	}
	for _, srv := range n.dnsSrv {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			_ = srv.ActivateAndServe()
		}()
	}
	return nil
}

// listen opens the unix socket QEMU connects to, replacing a stale socket file.
func (n *network) listen() error {
	if fi, err := os.Lstat(n.socketPath); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("listen %s: exists and is not a socket", n.socketPath)
		}
		if c, err := net.DialTimeout("unix", n.socketPath, 200*time.Millisecond); err == nil {
			c.Close()
			return fmt.Errorf("listen %s: another process serves this socket", n.socketPath)
		}
		_ = os.Remove(n.socketPath)
	}
	ln, err := net.Listen("unix", n.socketPath)
	if err != nil {
		return fmt.Errorf("listen %s: %w", n.socketPath, err)
	}
	if err := os.Chmod(n.socketPath, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("listen %s: %w", n.socketPath, err)
	}
	n.ln = ln
	return nil
}

// acceptLoop attaches each QEMU connection to the switch; a new one (QEMU restarted) replaces the
// previous one.
func (n *network) acceptLoop() {
	for {
		c, err := n.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				n.log.Error().Err(err).Msg("accept guest")
			}
			return
		}
		n.connMu.Lock()
		if n.closed {
			n.connMu.Unlock()
			c.Close()
			return
		}
		if old := n.guest; old != nil {
			old.Close()
		}
		n.guest = c
		n.connMu.Unlock()
		n.log.Info().Msg("guest attached")
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			err := n.sw.Accept(n.ctx, c, types.QemuProtocol)
			n.connMu.Lock()
			if n.guest == c {
				n.guest = nil
			}
			n.connMu.Unlock()
			n.log.Info().AnErr("reason", err).Msg("guest detached")
		}()
	}
}

func (n *network) close() {
	n.connMu.Lock()
	if n.closed {
		n.connMu.Unlock()
		return
	}
	n.closed = true
	if n.guest != nil {
		n.guest.Close()
	}
	n.connMu.Unlock()
	n.stopExpiry()
	n.cancel()
	if n.ln != nil {
		n.ln.Close()
		_ = os.Remove(n.socketPath)
	}
	n.conns.closeAll()
	n.flushLimits()
	for _, srv := range n.dnsSrv {
		_ = srv.Shutdown()
	}
	if n.dhcp != nil {
		_ = n.dhcp.Underlying.Close()
	}
	if n.stack != nil {
		n.stack.Close()
	}
	n.wg.Wait()
	if n.stack != nil {
		n.stack.Wait()
	}
}

func (n *network) policy() (Policy, *policy.Allowlist) {
	n.polMu.RLock()
	defer n.polMu.RUnlock()
	return n.pol, n.allow
}

// setPolicy replaces the policy and closes the open flows it refuses (audited as
// RulePolicyRevoked); it returns how many.
func (n *network) setPolicy(p Policy, a *policy.Allowlist) int {
	n.polMu.Lock()
	n.pol, n.allow = p, a
	n.noteHolds(p)
	n.polMu.Unlock()
	n.armExpiry(p)
	return n.rejudge(RulePolicyRevoked)
}

func (n *network) info() Info {
	p, _ := n.policy()
	n.connMu.Lock()
	attached := n.guest != nil
	n.connMu.Unlock()
	return Info{
		SandboxID:     n.id,
		SandboxName:   n.name,
		Mode:          p.Mode,
		EffectiveMode: effectiveMode(p, time.Now()),
		Expiry:        p.AllowAllUntil,
		Rules:         p.Allow,
		Repos:         p.Repos,
		SocketPath:    n.socketPath,
		GatewayIP:     GatewayIP,
		GuestIP:       GuestIP,
		GuestAttached: attached,
		DNS:           n.table.entries(),
		Counters:      countersOf(n),
		Limits:        n.budget.limits(),
	}
}

// emit publishes one decision and counts it.
func (n *network) emit(ev audit.Event) {
	ev.Time = time.Now().UTC()
	ev.Sandbox, ev.Name = n.id, n.name
	if ev.Decision == audit.Allow {
		n.allowed.Add(1)
	} else {
		n.denied.Add(1)
	}
	n.svc.cfg.Audit.Emit(n.ctx, ev)
	n.log.Debug().Str("layer", ev.Layer).Str("proto", ev.Proto).Str("host", ev.Host).Str("ip", ev.IP).
		Int("port", ev.Port).Str("decision", ev.Decision).Str("rule", ev.Rule).Str("reason", ev.Reason).Msg("egress decision")
}
