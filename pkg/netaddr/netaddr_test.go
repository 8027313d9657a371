package netaddr

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestSpecial(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		special bool
	}{
		{"127.0.0.1", true},
		{"127.255.0.9", true},
		{"10.20.0.5", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"172.32.0.1", false},
		{"192.168.1.1", true},
		{"100.64.0.9", true},
		{"100.127.255.255", true},
		{"100.128.0.1", false},
		{"169.254.169.254", true},
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"255.255.255.255", true},
		{"240.0.0.1", true},
		{"224.0.0.251", true},
		{"239.1.1.1", true},
		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"203.0.113.10", false}, // documentation, but not a host's or a LAN's: the tests' "public" CDN
		{"198.18.0.1", false},   // the netstack's synthetic override range
		{"::", true},
		{"::1", true},
		{"fd00::1", true},
		{"fc00::1", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"fec0::1", true},
		{"ff02::1", true},
		{"2001::1", true},      // Teredo
		{"64:ff9b:1::1", true}, // local-use NAT64
		{"100::1", true},
		{"2606:4700::1111", false},
		{"::ffff:127.0.0.1", true},
		{"::ffff:10.0.0.1", true},
		{"::ffff:169.254.169.254", true},
		{"::ffff:8.8.8.8", false},
		{"64:ff9b::a9fe:a9fe", true}, // NAT64 of 169.254.169.254
		{"64:ff9b::808:808", false},  // NAT64 of 8.8.8.8
		{"2002:a00:1::1", true},      // 6to4 of 10.0.0.1
		{"2002:a9fe:a9fe::", true},   // 6to4 of 169.254.169.254
		{"2002:808:808::1", false},   // 6to4 of 8.8.8.8
		{"::7f00:1", true},           // IPv4-compatible 127.0.0.1
		{"::808:808", false},         // IPv4-compatible 8.8.8.8
	} {
		got := Special(netip.MustParseAddr(tc.addr))
		if (got != "") != tc.special {
			t.Errorf("Special(%s) = %q, want special %v", tc.addr, got, tc.special)
		}
	}
	if Special(netip.Addr{}) == "" {
		t.Error("the zero Addr is public")
	}
}

func TestEmbedded(t *testing.T) {
	for in, want := range map[string]string{
		"::ffff:10.1.2.3":     "10.1.2.3",
		"64:ff9b::a01:203":    "10.1.2.3",
		"2002:a01:203:1::abc": "10.1.2.3",
		"::a01:203":           "10.1.2.3",
	} {
		v4, _, ok := Embedded(netip.MustParseAddr(in))
		if !ok || v4.String() != want {
			t.Errorf("Embedded(%s) = %s %v, want %s", in, v4, ok, want)
		}
	}
	for _, in := range []string{"::", "::1", "2606:4700::1111", "10.1.2.3"} {
		if _, _, ok := Embedded(netip.MustParseAddr(in)); ok {
			t.Errorf("Embedded(%s) found an IPv4 address", in)
		}
	}
}

func TestGuard(t *testing.T) {
	allow, err := ParseAllowPrivate([]string{"10.20.0.0/16", "fd00:20::/64", "169.254.169.254"})
	if err != nil {
		t.Fatal(err)
	}
	self := netip.MustParseAddr("198.51.100.7") // a public address of this host
	g := NewGuard(allow, StaticHostAddrs(self))
	for addr, ok := range map[string]bool{
		"10.20.0.5":              true,
		"::ffff:10.20.3.4":       true,
		"10.21.0.5":              false,
		"fd00:20::5":             true,
		"fd00:21::5":             false,
		"169.254.169.254":        true,
		"169.254.169.253":        false,
		"127.0.0.1":              false,
		"198.51.100.7":           false,
		"::ffff:198.51.100.7":    false,
		"198.51.100.8":           true,
		"8.8.8.8":                true,
		"64:ff9b::a14:5":         false, // NAT64 of 10.20.0.5: the allowance names the IPv4 address, not this form
		"2002:a9fe:a9fe::1":      false,
		"::ffff:169.254.169.254": true,
	} {
		err := g.Check(netip.MustParseAddr(addr))
		if (err == nil) != ok {
			t.Errorf("Check(%s) = %v, want allowed %v", addr, err, ok)
		}
		if err != nil && (!errors.Is(err, ErrPrivate) || !strings.Contains(err.Error(), "--allow-private")) {
			t.Errorf("Check(%s) = %q: want ErrPrivate naming --allow-private", addr, err)
		}
	}
	if err := NewGuard(nil, StaticHostAddrs()).Check(netip.MustParseAddr("10.0.0.1")); err == nil ||
		err.Error() != "10.0.0.1 is private (RFC 1918): refused (reach it only with --allow-private CIDR)" {
		t.Errorf("Check(10.0.0.1) = %v", err)
	}
}

func TestHostAddressesIncludeLoopback(t *testing.T) {
	if !HostAddresses().Contains(netip.MustParseAddr("127.0.0.1")) {
		t.Error("the host's addresses do not include 127.0.0.1")
	}
}

func TestParseAllowPrivate(t *testing.T) {
	got, err := ParseAllowPrivate([]string{"10.20.0.5/16", " 100.64.0.9 ", "::ffff:10.0.0.0/104", "fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "10.20.0.0/16 100.64.0.9/32 10.0.0.0/8 fd00::/8"; strings.Join(FormatPrefixes(got), " ") != want {
		t.Errorf("ParseAllowPrivate = %v, want %s", got, want)
	}
	for _, bad := range []string{"", "10.0.0.0/33", "nope", "0.0.0.0/0", "8.8.8.0/24", "10.0.0.0/7", "::/0", "fe80::1%eth0", "2606:4700::/32"} {
		if _, err := ParseAllowPrivate([]string{bad}); err == nil || !strings.HasPrefix(err.Error(), "invalid --allow-private ") {
			t.Errorf("ParseAllowPrivate(%q) = %v, want an invalid --allow-private error", bad, err)
		}
	}
}

// FuzzGuard: any 16 bytes, as IPv6 and (the last 4) as IPv4, never panic, and the IPv4-mapped
// form of an address is judged as the address itself.
func FuzzGuard(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "10.20.0.5", "169.254.169.254", "8.8.8.8", "::ffff:10.0.0.1", "64:ff9b::a9fe:a9fe", "2002:a00:1::1", "fd00::1", "2606:4700::1111"} {
		b := netip.MustParseAddr(s).As16()
		f.Add(b[:])
	}
	g := NewGuard(nil, StaticHostAddrs())
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) != 16 {
			return
		}
		a6 := netip.AddrFrom16([16]byte(b))
		v4 := netip.AddrFrom4([4]byte(b[12:16]))
		m := netip.AddrFrom16(v4.As16()) // ::ffff:v4
		if (g.Check(v4) == nil) != (g.Check(m) == nil) || (Special(v4) == "") != (Special(m) == "") {
			t.Fatalf("%s and %s judged differently", v4, m)
		}
		if e, _, ok := Embedded(a6); ok && Special(e) != "" && Special(a6) == "" {
			t.Fatalf("%s carries %s (%s) but is public", a6, e, Special(e))
		}
		_ = g.Check(a6)
	})
}
