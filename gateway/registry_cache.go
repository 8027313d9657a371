package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
)

// registryCache is the registry as a KV watch delivered it: each record's stored JSON and
// revision, by name. It serves the listings (ps, the lease watchdog, reconcile, the sweeps), so
// that none reads every key of the bucket per call; a single read and every write still go to
// the bucket, revision-checked. A write this process made is applied to it at once (the watch
// brings the same revision later, and it is skipped), so a listing right after a write sees it.
// When the bus connection was re-established the watch is started again from nothing (a fresh
// initial load), and until that load is done listings read the bucket as before.
type registryCache struct {
	mu    sync.Mutex
	recs  map[string]cached
	tombs map[string]uint64 // removed names: a put at or below this revision is older news
	live  bool              // the initial load of the current watch is done
	// sorted is every record by name, each decoded and encoded (view, enc): made again on the
	// first listing after a change, and never changed (listings share it). nil: not made yet.
	sorted []cached
	ready  chan struct{} // closed when live first became true
	once   sync.Once
}

type cached struct {
	name string
	data []byte
	rev  uint64
	at   time.Time    // when the bus stored it
	view *api.Sandbox // data decoded once, shared by every View: never changed
	enc  []byte       // view encoded (with its revision), for the listing replies: never changed
}

func newRegistryCache() *registryCache {
	return &registryCache{recs: map[string]cached{}, tombs: map[string]uint64{}, ready: make(chan struct{})}
}

// put records data at rev unless the cache already has that revision or a later one, or the
// name was removed at or after it.
func (c *registryCache) put(name string, data []byte, rev uint64) {
	c.putAt(name, data, rev, time.Now())
}

func (c *registryCache) putAt(name string, data []byte, rev uint64, at time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.recs[name]; ok && cur.rev >= rev {
		return
	}
	if t, ok := c.tombs[name]; ok && t >= rev {
		return
	}
	c.recs[name] = cached{name: name, data: data, rev: rev, at: at}
	c.sorted = nil
}

// remove forgets name; a put at or below rev that arrives later is ignored.
func (c *registryCache) remove(name string, rev uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.recs[name]; ok && cur.rev > rev {
		return // re-created after this removal
	}
	delete(c.recs, name)
	c.sorted = nil
	if c.tombs[name] < rev {
		c.tombs[name] = rev
	}
}

// load replaces everything with what a watch's initial load delivered (recs, and deleted: the
// revisions at which names were removed), and makes the cache live. This process's own writes
// made while the load was under way (all the cache holds before it is live: stale empties it)
// are kept where they are newer than what the load saw: the load may have been read before them,
// and the watch then brings them later still, as a revision the cache already has.
func (c *registryCache) load(recs map[string]cached, deleted map[string]uint64) {
	c.mu.Lock()
	for name, own := range c.recs {
		if in, ok := recs[name]; (!ok || in.rev < own.rev) && deleted[name] < own.rev {
			recs[name] = own
		}
	}
	for name, rev := range c.tombs {
		if in, ok := recs[name]; ok && in.rev <= rev {
			delete(recs, name)
		}
	}
	c.recs, c.live, c.sorted = recs, true, nil
	c.mu.Unlock()
	c.once.Do(func() { close(c.ready) })
}

// stale stops the cache serving listings until the next initial load, and forgets what it held
// (changes may be missed until then; listings read the bucket meanwhile).
func (c *registryCache) stale() {
	c.mu.Lock()
	c.live = false
	c.recs, c.tombs, c.sorted = map[string]cached{}, map[string]uint64{}, nil
	c.mu.Unlock()
}

// snapshot returns the stored records, or false while the cache is not live. With views they
// are the shared sorted listing (sortedLocked: the caller must not change it), each with its
// decoded record (none when it is damaged).
func (c *registryCache) snapshot(views bool) ([]cached, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live {
		return nil, false
	}
	if views {
		return c.sortedLocked(), true
	}
	out := make([]cached, 0, len(c.recs))
	for _, r := range c.recs {
		r.view, r.enc = nil, nil
		out = append(out, r)
	}
	return out, true
}

// sortedLocked is c.sorted, made now if a change made it stale: a record decoded and encoded
// once per revision (a damaged one has neither).
func (c *registryCache) sortedLocked() []cached {
	if c.sorted != nil {
		return c.sorted
	}
	sorted := make([]cached, 0, len(c.recs))
	for name, r := range c.recs {
		if r.view == nil {
			sb := &api.Sandbox{}
			if json.Unmarshal(r.data, sb) == nil {
				sb.Revision = r.rev
				if enc, err := json.Marshal(sb); err == nil {
					r.view, r.enc = sb, enc
					c.recs[name] = r
				}
			}
		}
		sorted = append(sorted, r)
	}
	slices.SortFunc(sorted, func(a, b cached) int { return strings.Compare(a.name, b.name) })
	c.sorted = sorted
	return sorted
}

// page returns the records named after after, in name order, that keep selects: at most
// limit of them. False while the cache is not live.
func (c *registryCache) page(after string, limit int, keep func(*api.Sandbox) bool) ([]cached, bool, error) {
	c.mu.Lock()
	if !c.live {
		c.mu.Unlock()
		return nil, false, nil
	}
	sorted := c.sortedLocked()
	c.mu.Unlock()
	i, _ := slices.BinarySearchFunc(sorted, after, func(r cached, name string) int { return strings.Compare(r.name, name) })
	var out []cached
	for _, r := range sorted[i:] {
		if len(out) == limit {
			break
		}
		if r.name == after {
			continue
		}
		if r.view == nil {
			return nil, true, fmt.Errorf("registry: record %s is damaged: %w", r.name, json.Unmarshal(r.data, &api.Sandbox{}))
		}
		if keep(r.view) {
			out = append(out, r)
		}
	}
	return out, true, nil
}

// waitLive waits (at most wait) for the first initial load, and says whether the cache is live.
func (c *registryCache) waitLive(ctx context.Context, wait time.Duration) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-c.ready:
	case <-ctx.Done():
	case <-t.C:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}

// cacheResync is how often the watch checks that the bus connection was not re-established
// under it (a variable for the tests).
var cacheResync = time.Second

// initialLoadWait bounds a watch's initial load before it is made again.
var initialLoadWait = 2 * time.Second

// followKV keeps cache true to the bucket kv until ctx ends: a watch of every key, its initial
// load swapped in whole, then each change applied; started again from nothing when it ends or
// the connection was re-established (changes may have been missed meanwhile).
func followKV(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, cache *registryCache) {
	// A JetStream restarted by the bus (its disk was full) leaves the watch's consumer gone.
	restarted := make(chan struct{}, 1)
	if sub, err := nc.Subscribe(bus.StoreRestartedSubject, func(*nats.Msg) {
		select {
		case restarted <- struct{}{}:
		default:
		}
	}); err == nil {
		defer sub.Unsubscribe()
	}
	for ctx.Err() == nil && !nc.IsClosed() {
		watchOnce(ctx, nc, kv, cache, restarted)
		cache.stale()
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func watchOnce(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, cache *registryCache, restarted <-chan struct{}) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !nc.IsConnected() {
		return // a watch asked for now would wait out its request deadline (5 s) in the reconnect buffer
	}
	reconnects := nc.Stats().Reconnects
	w, err := kv.WatchAll(wctx)
	if err != nil {
		return
	}
	defer w.Stop()
	t := time.NewTicker(cacheResync)
	defer t.Stop()
	// A watch made while the bus was still coming back may never finish its initial load: it
	// is made again (the listings read the bucket meanwhile).
	loadBy := time.NewTimer(initialLoadWait)
	defer loadBy.Stop()
	initial, deleted := map[string]cached{}, map[string]uint64{}
	loading := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-restarted:
			return
		case <-loadBy.C:
			if loading {
				return
			}
		case <-t.C:
			if nc.Stats().Reconnects != reconnects || !nc.IsConnected() {
				return
			}
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			switch {
			case e == nil: // the initial load is done
				if loading {
					cache.load(initial, deleted)
					loading, initial, deleted = false, nil, nil
				}
			case loading && e.Operation() == jetstream.KeyValuePut:
				initial[e.Key()] = cached{name: e.Key(), data: e.Value(), rev: e.Revision(), at: e.Created()}
				delete(deleted, e.Key())
			case loading:
				delete(initial, e.Key())
				deleted[e.Key()] = e.Revision()
			case e.Operation() == jetstream.KeyValuePut:
				cache.putAt(e.Key(), e.Value(), e.Revision(), e.Created())
			default:
				cache.remove(e.Key(), e.Revision())
			}
		}
	}
}

// storedAt says when the bus stored key, or false when the cache is not live or has no key.
func (c *registryCache) storedAt(key string) (time.Time, bool) {
	if c == nil {
		return time.Time{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.recs[key]
	return r.at, ok && c.live
}

// listCached is List served from the cache, or false while it is not live. shared returns the
// cache's own decoded records (View); otherwise each is decoded afresh, the caller's to change.
func (r *Registry) listCached(ctx context.Context, sel api.Selector, shared bool) ([]*api.Sandbox, bool, error) {
	if r.cache == nil || !r.cache.waitLive(ctx, 5*time.Second) {
		return nil, false, nil
	}
	recs, ok := r.cache.snapshot(shared)
	if !ok {
		return nil, false, nil
	}
	out := make([]*api.Sandbox, 0, len(recs))
	for _, c := range recs {
		sb := c.view
		if sb == nil {
			sb = &api.Sandbox{}
			if err := json.Unmarshal(c.data, sb); err != nil {
				return nil, true, fmt.Errorf("registry: record %s is damaged: %w", c.name, err)
			}
			sb.Revision = c.rev
		}
		if sel.Matches(sb.Labels) {
			out = append(out, sb)
		}
	}
	return out, true, nil
}
