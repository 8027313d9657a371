package netstack_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/IniZio/nexus/pkg/audit"
)

// TestFirstLookupOfFreshGuest is what busybox nslookup does as the very first query of a fresh
// guest: an A and an AAAA query back to back from one socket, both with the same ID (glibc's
// res_mkquery takes the ID from CLOCK_MONOTONIC, which has jiffy resolution in a TCG guest),
// and the first answer carrying that ID taken as the answer to A. The answer to A must come
// first, for a name answered from an override and for one resolved upstream, on every fresh
// network.
func TestFirstLookupOfFreshGuest(t *testing.T) {
	gateway := netip.MustParseAddrPort("192.168.127.1:53")
	for i := range 20 {
		name := "cdn.test" // resolved upstream: its answer takes longer than AAAA's
		if i%2 == 1 {
			name = "api.test" // a resolver override
		}
		e := newEnv(t, curated(t))
		c, err := e.guest.DialUDP(gateway)
		if err != nil {
			t.Fatal(err)
		}
		// A booted guest has its gateway's MAC from DHCP before it looks a name up. The fake
		// guest has not, and its stack may send packets queued behind ARP out of order; one
		// exchange first gets it there (a TXT query: answered at once, leaving the A lookup as
		// slow as it is for a guest's first name).
		prime := new(dns.Msg)
		prime.SetQuestion(name+".", dns.TypeTXT)
		pb, err := prime.Pack()
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(pb); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(make([]byte, 1500)); err != nil {
			t.Fatalf("network %d: no answer to the first query: %v", i, err)
		}
		const id = 0x4e58
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			q := new(dns.Msg)
			q.SetQuestion(name+".", qt)
			q.Id = id
			b, err := q.Pack()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var types []string
		buf := make([]byte, 1500)
		for len(types) < 2 {
			k, err := c.Read(buf)
			if err != nil {
				t.Fatalf("network %d, %s: answers %v, then: %v", i, name, types, err)
			}
			var r dns.Msg
			if err := r.Unpack(buf[:k]); err != nil || r.Id != id || len(r.Question) != 1 {
				t.Fatalf("network %d, %s: bad answer %v: %v", i, name, r, err)
			}
			types = append(types, dns.TypeToString[r.Question[0].Qtype])
			if len(types) == 1 && (r.Question[0].Qtype != dns.TypeA || len(r.Answer) == 0) {
				t.Fatalf("network %d, %s: the first answer is to %s with %d records, not to A: busybox would print no address", i, name, types[0], len(r.Answer))
			}
		}
		c.Close()
		e.log.waitEvent(t, audit.Event{Layer: "dns", Host: name, Decision: "allow", Reason: "answered"})
		e.guest.Close()
	}
}
