// Package gateway is the front of nexus: the sandbox registry, the orchestration of create and
// remove across services, and the bus API that the CLI and the MCP server call.
package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Registry is the sandbox registry in KV nexus_sandboxes: one key per sandbox name, every
// update checked against the revision it was read at, every state change an event. Each KV
// operation has its own deadline of seconds (bus.StoreTimeout) and fails with its cause.
type Registry struct {
	kv  jetstream.KeyValue
	js  jetstream.JetStream
	now func() time.Time
	// home is where the bus keeps its store, named when a write fails for a full disk.
	home string
	// cache serves the listings, fed by a watch of the bucket (registry_cache.go).
	cache *registryCache
}

// NewRegistry binds to the registry bucket, and follows it (registry_cache.go) until ctx ends.
func NewRegistry(ctx context.Context, nc *nats.Conn) (*Registry, error) {
	kv, err := bus.KV(ctx, nc, bus.KVSandboxes)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	r := &Registry{kv: kv, js: js, now: time.Now, cache: newRegistryCache()}
	go followKV(ctx, nc, kv, r.cache)
	return r, nil
}

// NewID returns a fresh sandbox id: short, random, safe in subjects and paths.
func NewID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "sb-" + hex.EncodeToString(b)
}

// Create stores a new record in state created. A taken name is a conflict.
func (r *Registry) Create(ctx context.Context, sb *api.Sandbox) error {
	now := r.now().UTC()
	sb.State = api.StateCreated
	sb.CreatedAt, sb.UpdatedAt = now, now
	if sb.ID == "" {
		sb.ID = NewID()
	}
	b, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	kctx, cancel := bus.StoreContext(ctx)
	rev, err := r.kv.Create(kctx, sb.Name, b)
	cancel()
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return errdefs.Conflict("sandbox %s already exists", sb.Name)
		}
		return fmt.Errorf("registry: create %s: %w", sb.Name, bus.StoreError(err, r.home))
	}
	sb.Revision = rev
	r.cache.put(sb.Name, b, rev)
	r.event(ctx, sb, "", api.StateCreated, "")
	return nil
}

// Get reads one record.
func (r *Registry) Get(ctx context.Context, name string) (*api.Sandbox, error) {
	kctx, cancel := bus.StoreContext(ctx)
	e, err := r.kv.Get(kctx, name)
	cancel()
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, errdefs.NotFound("no sandbox named %s%s", name, r.didYouMean(ctx, name))
		}
		return nil, fmt.Errorf("registry: get %s: %w", name, bus.StoreError(err, r.home))
	}
	var sb api.Sandbox
	if err := json.Unmarshal(e.Value(), &sb); err != nil {
		return nil, fmt.Errorf("registry: record %s is damaged: %w", name, err)
	}
	sb.Revision = e.Revision()
	return &sb, nil
}

// didYouMean names the sandboxes of other projects with the same short name as a missing
// one ("; did you mean demo/t1?"), or nothing.
func (r *Registry) didYouMean(ctx context.Context, name string) string {
	_, short, ok := strings.Cut(name, "/")
	if !ok {
		return ""
	}
	kctx, cancel := bus.StoreContext(ctx)
	defer cancel()
	lister, err := r.kv.ListKeys(kctx)
	if err != nil {
		return ""
	}
	defer lister.Stop()
	var near []string
	for key := range lister.Keys() {
		if _, s, _ := strings.Cut(key, "/"); s == short && key != name && len(near) < 3 {
			near = append(near, key)
		}
	}
	if len(near) == 0 {
		return ""
	}
	return "; did you mean " + strings.Join(near, " or ") + "?"
}

// List returns the records matching sel, sorted by name: from the cache that a watch of the
// bucket keeps, or (while it is not loaded) read key by key.
func (r *Registry) List(ctx context.Context, sel api.Selector) ([]*api.Sandbox, error) {
	return r.list(ctx, sel, false)
}

// View is List for a reader that changes nothing it gets: the records may be shared with other
// readers (decoded once per revision), so the 10,000 of a large registry are not decoded per
// call.
func (r *Registry) View(ctx context.Context, sel api.Selector) ([]*api.Sandbox, error) {
	return r.list(ctx, sel, true)
}

func (r *Registry) list(ctx context.Context, sel api.Selector, shared bool) ([]*api.Sandbox, error) {
	out, ok, err := r.listCached(ctx, sel, shared)
	if err != nil {
		return nil, err
	}
	if !ok {
		if out, err = r.scan(ctx, sel); err != nil {
			return nil, err
		}
	}
	if !ok || !shared { // the cache's shared records come sorted
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	}
	return out, nil
}

// listed is one record of a page: shared like View's, and its JSON when the cache has it.
type listed struct {
	sb  *api.Sandbox
	enc []byte
}

// page is one page of a listing for a reader that changes nothing it gets: the records named
// after after, in name order, that sel and keep select, at most limit. From the cache it costs
// the page, not the registry; while the cache is not live the bucket is read as List does.
func (r *Registry) page(ctx context.Context, sel api.Selector, after string, limit int, keep func(*api.Sandbox) bool) ([]listed, error) {
	match := func(sb *api.Sandbox) bool { return sel.Matches(sb.Labels) && keep(sb) }
	if r.cache != nil && r.cache.waitLive(ctx, 5*time.Second) {
		recs, ok, err := r.cache.page(after, limit, match)
		if err != nil {
			return nil, err
		}
		if ok {
			out := make([]listed, len(recs))
			for i, c := range recs {
				out[i] = listed{sb: c.view, enc: c.enc}
			}
			return out, nil
		}
	}
	all, err := r.scan(ctx, sel)
	if err != nil {
		return nil, err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	all = all[sort.Search(len(all), func(i int) bool { return all[i].Name > after }):]
	var out []listed
	for _, sb := range all {
		if len(out) == limit {
			break
		}
		if keep(sb) {
			out = append(out, listed{sb: sb})
		}
	}
	return out, nil
}

// scan reads every record of the bucket, one key at a time.
func (r *Registry) scan(ctx context.Context, sel api.Selector) ([]*api.Sandbox, error) {
	// Not bounded by StoreTimeout: the listing lives as long as the loop below reads it.
	lister, err := r.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("registry: list: %w", bus.StoreError(err, r.home))
	}
	defer lister.Stop()
	var out []*api.Sandbox
	for key := range lister.Keys() {
		sb, err := r.Get(ctx, key)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // removed while listing
		}
		if err != nil {
			return nil, err
		}
		if sel.Matches(sb.Labels) {
			out = append(out, sb)
		}
	}
	return out, nil
}

// Update writes sb if nobody changed it since it was read; otherwise it is a conflict.
func (r *Registry) Update(ctx context.Context, sb *api.Sandbox) error {
	sb.UpdatedAt = r.now().UTC()
	b, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	kctx, cancel := bus.StoreContext(ctx)
	rev, err := r.kv.Update(kctx, sb.Name, b, sb.Revision)
	cancel()
	if err != nil {
		if isWrongRevision(err) {
			return errdefs.Conflict("sandbox %s was changed by someone else; read it again and retry", sb.Name)
		}
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return errdefs.NotFound("no sandbox named %s", sb.Name)
		}
		return fmt.Errorf("registry: update %s: %w", sb.Name, bus.StoreError(err, r.home))
	}
	sb.Revision = rev
	r.cache.put(sb.Name, b, rev)
	return nil
}

// Transition moves a sandbox to state to, applying mutate (may be nil) in the same
// revision-checked write, and publishes the lifecycle event. An illegal move is a conflict
// naming both states.
func (r *Registry) Transition(ctx context.Context, sb *api.Sandbox, to api.State, reason string, mutate func(*api.Sandbox)) error {
	from := sb.State
	if !api.CanTransition(from, to) {
		return errdefs.Conflict("sandbox %s is %s; it cannot become %s", sb.Name, from, to)
	}
	next := *sb
	next.State = to
	next.Reason = reason
	if to == api.StateRunning && from != api.StatePaused {
		next.StartedAt = r.now().UTC()
		next.Fork = "" // a fork's VM ran: from now on it boots from its own disk
	}
	if mutate != nil {
		mutate(&next)
	}
	if err := r.Update(ctx, &next); err != nil {
		return err
	}
	*sb = next
	r.event(ctx, sb, from, to, reason)
	return nil
}

// Delete removes the record if it is still at the revision read.
func (r *Registry) Delete(ctx context.Context, sb *api.Sandbox) error {
	kctx, cancel := bus.StoreContext(ctx)
	err := r.kv.Purge(kctx, sb.Name, jetstream.LastRevision(sb.Revision))
	cancel()
	if err != nil {
		if isWrongRevision(err) {
			return errdefs.Conflict("sandbox %s was changed by someone else; read it again and retry", sb.Name)
		}
		return fmt.Errorf("registry: delete %s: %w", sb.Name, bus.StoreError(err, r.home))
	}
	r.cache.remove(sb.Name, sb.Revision)
	r.event(ctx, sb, sb.State, "", "removed")
	return nil
}

// Watch streams every change to the registry until ctx ends.
func (r *Registry) Watch(ctx context.Context) (jetstream.KeyWatcher, error) {
	return r.kv.WatchAll(ctx, jetstream.UpdatesOnly())
}

func (r *Registry) event(ctx context.Context, sb *api.Sandbox, from, to api.State, reason string) {
	ev := api.Event{Type: "state", Sandbox: sb.Name, ID: sb.ID, From: from, To: to, Reason: reason, Time: r.now().UTC()}
	if to == "" {
		ev.Type = "removed"
	}
	b, _ := json.Marshal(ev)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// The record is the truth; an event that cannot be stored is retried once and then dropped
	// rather than failing the transition that already happened.
	if _, err := r.js.Publish(pctx, api.EventSubject(sb.ID), b); err != nil {
		r.js.Publish(pctx, api.EventSubject(sb.ID), b)
	}
}

func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return true
	}
	return errors.Is(err, jetstream.ErrKeyExists)
}
