// Command probe is copied into test guests (static, no libc) to send what busybox cannot: a UDP
// datagram that waits for its answer, and IPv6 frames written straight onto eth0 the way an
// adversarial guest would (addressed to the gateway's MAC, bypassing neighbour discovery).
//
//	probe udp IP:PORT MESSAGE     exit 0 with the reply, 1 without one
//	probe http IP METHOD URL BODY [NAME:VALUE]...   one HTTP(S) request (http.go)
//	probe ipv6 ADDR PORT          connect(2) first, then raw TCP SYN, UDP and ICMPv6 echo
//	                              frames; exit 0 only if anything answered
//	probe dnsflood IP:PORT SECONDS  DNS queries for long random names as fast as it can;
//	                              prints how many it sent
package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// gatewayMAC is the netstack gateway's link address.
var gatewayMAC = net.HardwareAddr{0x02, 0x6e, 0x78, 0x00, 0x00, 0x01}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: probe udp IP:PORT MESSAGE | probe ipv6 ADDR PORT")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "udp":
		os.Exit(udp(os.Args[2], os.Args[3]))
	case "http":
		os.Exit(httpProbe(os.Args[2:]))
	case "dnsflood":
		secs, _ := strconv.Atoi(os.Args[3])
		os.Exit(dnsflood(os.Args[2], time.Duration(secs)*time.Second))
	case "ipv6":
		port, _ := strconv.Atoi(os.Args[3])
		os.Exit(ipv6(netip.MustParseAddr(os.Args[2]), uint16(port)))
	}
	os.Exit(2)
}

// dnsflood sends A queries for names of three 60-byte labels and a counter, each name new, without waiting
// for the answers (a reader drains them), for d.
func dnsflood(addr string, d time.Duration) int {
	c, err := net.Dial("udp", addr)
	if err != nil {
		fmt.Println("dnsflood:", err)
		return 1
	}
	defer c.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			if _, err := c.Read(buf); err != nil {
				if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
					return
				}
			}
		}
	}()
	label := make([]byte, 60)
	for i := range label {
		label[i] = 'a' + byte(i%26)
	}
	sent := 0
	for end := time.Now().Add(d); time.Now().Before(end); sent++ {
		q := []byte{byte(sent >> 8), byte(sent), 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
		for l := 0; l < 3; l++ {
			q = append(q, 60)
			q = append(q, label...)
		}
		tag := fmt.Sprintf("n%d", sent)
		q = append(q, byte(len(tag)))
		q = append(q, tag...)
		q = append(q, 5, 'f', 'l', 'o', 'o', 'd', 0, 0, 1, 0, 1)
		if _, err := c.Write(q); err != nil {
			time.Sleep(time.Millisecond) // the socket buffer is full
		}
	}
	fmt.Println("sent", sent)
	return 0
}

func udp(addr, msg string) int {
	c, err := net.Dial("udp", addr)
	if err != nil {
		fmt.Println("udp:", err)
		return 1
	}
	defer c.Close()
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		fmt.Println("udp send:", err)
		return 1
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		fmt.Println("udp: no reply:", err)
		return 1
	}
	fmt.Printf("udp reply: %s", buf[:n])
	return 0
}

func ipv6(dst netip.Addr, port uint16) int {
	answered := 0
	// What a program sees: the kernel has no IPv6 route.
	c, err := net.DialTimeout("tcp6", netip.AddrPortFrom(dst, port).String(), 3*time.Second)
	if err == nil {
		c.Close()
		fmt.Println("tcp6 connect: connected")
		answered++
	} else {
		fmt.Println("tcp6 connect:", err)
	}
	// What an adversary can do: write frames to the gateway's MAC itself.
	ifi, err := net.InterfaceByName("eth0")
	if err != nil {
		fmt.Println("eth0:", err)
		return 2
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_IPV6)))
	if err != nil {
		fmt.Println("packet socket:", err)
		return 2
	}
	defer unix.Close(fd)
	sll := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: ifi.Index}
	if err := unix.Bind(fd, sll); err != nil {
		fmt.Println("bind:", err)
		return 2
	}
	src := netip.MustParseAddr("fd00:6e78::2")
	for _, f := range []struct {
		name  string
		proto byte
		l4    []byte
	}{
		{"tcp syn", unix.IPPROTO_TCP, tcpSYN(port)},
		{"udp", unix.IPPROTO_UDP, udpDatagram(port, []byte("probe-v6\n"))},
		{"icmpv6 echo", unix.IPPROTO_ICMPV6, []byte{128, 0, 0, 0, 0x12, 0x34, 0, 1, 'p', 'r', 'o', 'b', 'e'}},
	} {
		pkt := ipv6Packet(src, dst, f.proto, f.l4)
		frame := append(append(append([]byte{}, gatewayMAC...), ifi.HardwareAddr...), 0x86, 0xdd)
		frame = append(frame, pkt...)
		to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: ifi.Index, Halen: 6}
		copy(to.Addr[:], gatewayMAC)
		if err := unix.Sendto(fd, frame, 0, to); err != nil {
			fmt.Printf("raw %s: send: %v\n", f.name, err)
			continue
		}
		fmt.Printf("raw %s: sent to [%s]:%d\n", f.name, dst, port)
	}
	// Any IPv6 frame back from the gateway to our source address is an answer.
	tv := unix.NsecToTimeval((3 * time.Second).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 2048)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			break
		}
		if n >= 14+40 && net.HardwareAddr(buf[6:12]).String() == gatewayMAC.String() {
			d, _ := netip.AddrFromSlice(buf[14+24 : 14+40])
			if d == src {
				fmt.Println("raw: answered by the gateway")
				answered++
				break
			}
		}
	}
	if answered == 0 {
		fmt.Println("ipv6: no answer")
		return 1
	}
	return 0
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func ipv6Packet(src, dst netip.Addr, proto byte, l4 []byte) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(l4)))
	h[6], h[7] = proto, 64
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	// Transport checksum over the pseudo-header.
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(s[:])
	add(d[:])
	sum += uint32(len(l4)) + uint32(proto)
	add(l4)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	ck := ^uint16(sum)
	switch proto {
	case unix.IPPROTO_TCP:
		binary.BigEndian.PutUint16(l4[16:], ck)
	case unix.IPPROTO_UDP:
		binary.BigEndian.PutUint16(l4[6:], ck)
	case unix.IPPROTO_ICMPV6:
		binary.BigEndian.PutUint16(l4[2:], ck)
	}
	return append(h, l4...)
}

func tcpSYN(port uint16) []byte {
	t := make([]byte, 20)
	binary.BigEndian.PutUint16(t[0:], 40000)
	binary.BigEndian.PutUint16(t[2:], port)
	binary.BigEndian.PutUint32(t[4:], 1)
	t[12] = 5 << 4
	t[13] = 0x02 // SYN
	binary.BigEndian.PutUint16(t[14:], 64240)
	return t
}

func udpDatagram(port uint16, payload []byte) []byte {
	u := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], 40001)
	binary.BigEndian.PutUint16(u[2:], port)
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[8:], payload)
	return u
}
