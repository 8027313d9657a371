package mitm

import (
	"container/list"
	"crypto/tls"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// leafCache holds minted leaves per host, least recently used evicted first. Concurrent misses
// for the same host mint once (singleflight).
type leafCache struct {
	ca  *CA
	max int
	now func() time.Time

	mu    sync.Mutex
	ll    *list.List // front = most recently used; values are *leafEntry
	byKey map[string]*list.Element
	group singleflight.Group

	mints int64 // guarded by mu; for tests and metrics
}

type leafEntry struct {
	host string
	cert *tls.Certificate
}

func newLeafCache(ca *CA, max int) *leafCache {
	if max <= 0 {
		max = 1024
	}
	return &leafCache{ca: ca, max: max, now: time.Now, ll: list.New(), byKey: map[string]*list.Element{}}
}

// get returns a valid leaf for host, minting it on a miss or when the cached one nears expiry.
func (c *leafCache) get(host string) (*tls.Certificate, error) {
	now := c.now()
	c.mu.Lock()
	if el, ok := c.byKey[host]; ok {
		e := el.Value.(*leafEntry)
		if now.Add(leafRenewBefore).Before(e.cert.Leaf.NotAfter) {
			c.ll.MoveToFront(el)
			c.mu.Unlock()
			return e.cert, nil
		}
	}
	c.mu.Unlock()

	v, err, _ := c.group.Do(host, func() (any, error) {
		cert, err := c.ca.mint(host, now)
		if err != nil {
			return nil, err
		}
		c.put(host, cert)
		return cert, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*tls.Certificate), nil
}

func (c *leafCache) put(host string, cert *tls.Certificate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mints++
	if el, ok := c.byKey[host]; ok {
		el.Value.(*leafEntry).cert = cert
		c.ll.MoveToFront(el)
		return
	}
	c.byKey[host] = c.ll.PushFront(&leafEntry{host: host, cert: cert})
	for c.ll.Len() > c.max {
		old := c.ll.Back()
		c.ll.Remove(old)
		delete(c.byKey, old.Value.(*leafEntry).host)
	}
}

func (c *leafCache) stats() (size int, mints int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len(), c.mints
}
