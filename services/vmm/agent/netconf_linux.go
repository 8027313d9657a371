package agent

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// ConfigureInterface brings ifname up with the static address (and default route) of n, over
// rtnetlink: no ip(8) needed in the image.
func ConfigureInterface(ifname string, n agentproto.NetworkConfig) error {
	pfx, err := netip.ParsePrefix(n.Address)
	if err != nil || !pfx.Addr().Is4() {
		return errdefs.Invalid("network: address %.60q is not an IPv4 CIDR", n.Address)
	}
	var gw netip.Addr
	if n.Gateway != "" {
		if gw, err = netip.ParseAddr(n.Gateway); err != nil || !gw.Is4() {
			return errdefs.Invalid("network: gateway %.60q is not an IPv4 address", n.Gateway)
		}
	}
	var mac net.HardwareAddr
	if n.MAC != "" {
		if mac, err = net.ParseMAC(n.MAC); err != nil || len(mac) != 6 || mac[0]&1 != 0 {
			return errdefs.Invalid("network: mac %.60q is not a unicast aa:bb:cc:dd:ee:ff", n.MAC)
		}
	}
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("network: %s: %w", ifname, err)
	}
	nl, err := openNetlink()
	if err != nil {
		return err
	}
	defer unix.Close(nl)
	// Before anything else goes out: the kernel flushes the interface's neighbours on the change,
	// so the gateway learns the new address from the guest's next ARP.
	if mac != nil && !bytes.Equal(mac, ifc.HardwareAddr) {
		if err := setLinkAddress(nl, ifc.Index, mac); err != nil {
			return fmt.Errorf("network: %s mac: %w", ifname, err)
		}
	}
	if err := linkUp(nl, ifc.Index); err != nil {
		return fmt.Errorf("network: %s up: %w", ifname, err)
	}
	if err := addAddr(nl, ifc.Index, pfx); err != nil && err != unix.EEXIST {
		return fmt.Errorf("network: %s address: %w", ifname, err)
	}
	if gw.IsValid() {
		if err := addDefaultRoute(nl, ifc.Index, gw); err != nil && err != unix.EEXIST {
			return fmt.Errorf("network: default route: %w", err)
		}
	}
	return nil
}

// LinkUp brings an interface up (used for lo).
func LinkUp(ifname string) error {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("network: %s: %w", ifname, err)
	}
	nl, err := openNetlink()
	if err != nil {
		return err
	}
	defer unix.Close(nl)
	return linkUp(nl, ifc.Index)
}

// WriteResolvConf writes nameservers to path (/etc/resolv.conf), replacing a symlink if any.
func WriteResolvConf(path string, dns []string) error {
	var b strings.Builder
	for _, d := range dns {
		if _, err := netip.ParseAddr(d); err != nil {
			return errdefs.Invalid("network: dns %.60q is not an address", d)
		}
		fmt.Fprintf(&b, "nameserver %s\n", d)
	}
	os.Remove(path)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func openNetlink() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return -1, fmt.Errorf("network: netlink: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("network: netlink: %w", err)
	}
	return fd, nil
}

// nlRequest sends one rtnetlink request (header + body + attributes) and waits for its ack.
func nlRequest(fd int, typ uint16, flags uint16, body []byte, attrs ...[]byte) error {
	msg := make([]byte, unix.SizeofNlMsghdr, 256)
	msg = append(msg, body...)
	for _, a := range attrs {
		msg = append(msg, a...)
	}
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], 1) // seq
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return unix.Errno(-e)
				}
				return nil
			}
		}
	}
}

func rtattr(typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(l))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofRtAttr:], data)
	return b
}

func linkUp(fd, index int) error {
	body := make([]byte, unix.SizeofIfInfomsg)
	body[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(body[4:], uint32(index))
	binary.NativeEndian.PutUint32(body[8:], unix.IFF_UP)  // flags
	binary.NativeEndian.PutUint32(body[12:], unix.IFF_UP) // change
	return nlRequest(fd, unix.RTM_NEWLINK, 0, body)
}

// setLinkAddress sets an interface's MAC address (virtio-net changes it while up).
func setLinkAddress(fd, index int, mac net.HardwareAddr) error {
	body := make([]byte, unix.SizeofIfInfomsg)
	body[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(body[4:], uint32(index))
	return nlRequest(fd, unix.RTM_NEWLINK, 0, body, rtattr(unix.IFLA_ADDRESS, mac))
}

func addAddr(fd, index int, pfx netip.Prefix) error {
	body := make([]byte, unix.SizeofIfAddrmsg)
	body[0] = unix.AF_INET
	body[1] = byte(pfx.Bits())
	body[3] = unix.RT_SCOPE_UNIVERSE
	binary.NativeEndian.PutUint32(body[4:], uint32(index))
	a := pfx.Addr().As4()
	return nlRequest(fd, unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body,
		rtattr(unix.IFA_LOCAL, a[:]), rtattr(unix.IFA_ADDRESS, a[:]))
}

func addDefaultRoute(fd, index int, gw netip.Addr) error {
	body := make([]byte, unix.SizeofRtMsg)
	body[0] = unix.AF_INET
	body[4] = unix.RT_TABLE_MAIN
	body[5] = unix.RTPROT_BOOT
	body[6] = unix.RT_SCOPE_UNIVERSE
	body[7] = unix.RTN_UNICAST
	g := gw.As4()
	var oif [4]byte
	binary.NativeEndian.PutUint32(oif[:], uint32(index))
	return nlRequest(fd, unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body,
		rtattr(unix.RTA_GATEWAY, g[:]), rtattr(unix.RTA_OIF, oif[:]))
}
