// Package netstack is the netstack service: one default-deny userspace network per sandbox.
//
// Each network is a gvisor stack built from gvisor-tap-vsock parts (tap.Switch, tap.LinkEndpoint,
// the QEMU stream protocol, its DHCP server) with netstack's own TCP and UDP forwarders installed.
// QEMU connects to the network's unix socket with
// -netdev stream,server=off,addr.type=unix,addr.path=<socket>. The gateway is 192.168.127.1 and the
// guest 192.168.127.2/24.
//
// Every TCP SYN, UDP datagram, ICMP echo and DNS query the guest sends is judged against the
// sandbox's policy and produces exactly one audit.Event:
//
//   - DNS (gateway:53, UDP and TCP): allowed names are resolved upstream (A only; AAAA gets an
//     empty answer because the network is IPv4 only) and the answers recorded, so that a later
//     connection to an IP is matched to the names that resolved to it. Other names: NXDOMAIN.
//   - TCP: allowed when the destination IP was answered for an allowed name (within TTL plus a
//     grace) and the rule covers the port; otherwise RST. In curated mode ports 443 and 80 go
//     through the SNI→CONNECT shim into mitm, after checking the ClientHello SNI (or HTTP Host)
//     itself against the allowlist; their single audit event is emitted after that check. Other
//     allowed ports are proxied straight to the resolved IP.
//   - UDP: only DNS to the gateway; everything else is dropped (allow-all forwards UDP flows and
//     audits each new flow once).
//   - ICMP echo: to the gateway or to an IP answered for an allowed name, the gateway answers
//     itself (it does not ping the real host: a reply says the perimeter would let TCP through, not
//     that the host is up); everything else is dropped without reply.
//   - IPv6: dropped; TCP SYNs, UDP and ICMPv6 echo are audited as denied.
//
// Mode allow-all allows everything (still audited, no MITM, direct dials) until its expiry, which
// is compared on every decision; after it the network is default-deny plus its rules. Mode none
// lets nothing out: DNS answers REFUSED.
package netstack
