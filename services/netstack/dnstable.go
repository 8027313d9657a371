package netstack

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
)

// maxDNSNames bounds the table of one sandbox; past it the stalest names are dropped.
const maxDNSNames = 4096

// dnsTable records which IPs were answered for which names, each (name, ip) pair with its own
// expiry, so a connection to an IP can be matched to the names that resolved to it. Answers that
// rotate (CDNs) do not revoke earlier IPs before their TTL ends.
type dnsTable struct {
	mu    sync.Mutex
	names map[string]*nameEntry
	rev   map[netip.Addr]map[string]struct{}
}

type nameEntry struct {
	ips     map[netip.Addr]time.Time // ip → TTL end
	ttl     int                      // of the latest answer
	expires time.Time                // of the latest answer
	last    []netip.Addr             // latest answer, in order
}

func newDNSTable() *dnsTable {
	return &dnsTable{names: map[string]*nameEntry{}, rev: map[netip.Addr]map[string]struct{}{}}
}

func (t *dnsTable) record(name string, ips []netip.Addr, ttl int, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.names[name]
	if !ok {
		if len(t.names) >= maxDNSNames {
			t.evictLocked()
		}
		e = &nameEntry{ips: map[netip.Addr]time.Time{}}
		t.names[name] = e
	}
	exp := now.Add(time.Duration(ttl) * time.Second)
	e.ttl, e.expires, e.last = ttl, exp, slices.Clone(ips)
	for _, ip := range ips {
		if e.ips[ip].Before(exp) {
			e.ips[ip] = exp
		}
		set := t.rev[ip]
		if set == nil {
			set = map[string]struct{}{}
			t.rev[ip] = set
		}
		set[name] = struct{}{}
	}
}

// evictLocked drops the name whose latest answer expired first.
func (t *dnsTable) evictLocked() {
	var oldest string
	var at time.Time
	for name, e := range t.names {
		if oldest == "" || e.expires.Before(at) {
			oldest, at = name, e.expires
		}
	}
	e := t.names[oldest]
	for ip := range e.ips {
		delete(t.rev[ip], oldest)
		if len(t.rev[ip]) == 0 {
			delete(t.rev, ip)
		}
	}
	delete(t.names, oldest)
}

// namesFor returns the names (sorted) that resolved to ip and whose answer is within TTL + grace.
func (t *dnsTable) namesFor(ip netip.Addr, now time.Time, grace time.Duration) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for name := range t.rev[ip] {
		if exp, ok := t.names[name].ips[ip]; ok && now.Before(exp.Add(grace)) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func (t *dnsTable) entries() []netstackapi.DNSEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]netstackapi.DNSEntry, 0, len(t.names))
	for name, e := range t.names {
		ips := make([]string, len(e.last))
		for i, ip := range e.last {
			ips[i] = ip.String()
		}
		out = append(out, netstackapi.DNSEntry{Name: name, IPs: ips, TTL: e.ttl, Expires: e.expires})
	}
	slices.SortFunc(out, func(a, b netstackapi.DNSEntry) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}
