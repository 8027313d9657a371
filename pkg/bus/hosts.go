package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Hosts heartbeat their capacity into KVHosts, one key per host (its vmm writes it); the
// gateway places new sandboxes by it and `nexus hosts` lists it. A host whose heartbeat is
// older than its TTL is lost. An operator's drain is the key drain.<host>; a sandbox removed
// while its host was lost is the key removed.<host>.<id> until the host, back, has removed
// what it still held of it (OweRemoval).
const (
	KVHosts = "nexus_hosts"
	// HeartbeatEvery is how often a host's vmm writes its heartbeat.
	HeartbeatEvery = 2 * time.Second
	// HostTTL is how long a heartbeat counts: a host silent for longer is lost.
	HostTTL = 10 * time.Second

	drainPrefix   = "drain."
	removedPrefix = "removed."
)

// HostBeat is one host's heartbeat.
type HostBeat struct {
	Host    string `json:"host"`
	Version string `json:"version,omitempty"`
	// MemoryMiB is what sandboxes may take on the host in all (its --memory-share of RAM);
	// MemoryUsedMiB what its running sandboxes hold, QEMU overhead included.
	MemoryMiB     int               `json:"memory_mib"`
	MemoryUsedMiB int               `json:"memory_used_mib"`
	VCPUs         int               `json:"vcpus"`
	DiskFree      uint64            `json:"disk_free"`
	DiskTotal     uint64            `json:"disk_total"`
	Running       int               `json:"running"`
	Labels        map[string]string `json:"labels,omitempty"`
	At            time.Time         `json:"at"`
	TTL           time.Duration     `json:"ttl"`
}

// FreeMiB is the memory a new sandbox could still take on the host.
func (b HostBeat) FreeMiB() int { return max(b.MemoryMiB-b.MemoryUsedMiB, 0) }

// Host states in `nexus hosts`.
const (
	HostUp       = "up"
	HostDraining = "draining"
	HostLost     = "lost"
)

// HostState is a host as `nexus hosts` shows it.
type HostState struct {
	HostBeat
	State string `json:"state"`
	// Drained is set when an operator drained the host: nothing new is placed there.
	Drained bool `json:"drained,omitempty"`
	// PendingRemovals counts the sandboxes removed while the host was lost whose VM, disk
	// and perimeter there are still to go (removed once the host is back).
	PendingRemovals int `json:"pending_removals,omitempty"`
}

// Beat writes host's heartbeat.
func Beat(ctx context.Context, kv jetstream.KeyValue, b HostBeat) error {
	if b.TTL == 0 {
		b.TTL = HostTTL
	}
	body, _ := json.Marshal(b)
	_, err := kv.Put(ctx, b.Host, body)
	return err
}

// Hosts lists every host that ever heartbeat, with its state at now, by name.
func Hosts(ctx context.Context, kv jetstream.KeyValue, now time.Time) ([]HostState, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var beats []HostBeat
	drained := map[string]bool{}
	owed := map[string]int{}
	for k := range lister.Keys() {
		if h, ok := strings.CutPrefix(k, drainPrefix); ok {
			drained[h] = true
			continue
		}
		if rest, ok := strings.CutPrefix(k, removedPrefix); ok {
			h, _, _ := strings.Cut(rest, ".")
			owed[h]++
			continue
		}
		e, err := kv.Get(ctx, k)
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				continue
			}
			return nil, err
		}
		var b HostBeat
		if json.Unmarshal(e.Value(), &b) != nil || b.Host != k {
			continue
		}
		beats = append(beats, b)
	}
	out := make([]HostState, 0, len(beats))
	for _, b := range beats {
		st := HostUp
		switch {
		case now.Sub(b.At) > b.TTL:
			st = HostLost
		case drained[b.Host]:
			st = HostDraining
		}
		out = append(out, HostState{HostBeat: b, State: st, Drained: drained[b.Host], PendingRemovals: owed[b.Host]})
	}
	slices.SortFunc(out, func(a, b HostState) int { return strings.Compare(a.Host, b.Host) })
	return out, nil
}

// Removal is a sandbox removed while its host was lost: its record is gone, and what the
// host still holds of it (its VM, disk and perimeter) is removed when the host is back.
type Removal struct {
	Host string    `json:"host"`
	ID   string    `json:"id"`
	Name string    `json:"name"`
	At   time.Time `json:"at"`
}

func removalKey(host, id string) (string, error) {
	if err := validHostName(host); err != nil {
		return "", err
	}
	if err := validHostName(id); err != nil {
		return "", fmt.Errorf("sandbox id %q is not one subject token", id)
	}
	return removedPrefix + host + "." + id, nil
}

// OweRemoval records that r's host still holds a removed sandbox.
func OweRemoval(ctx context.Context, kv jetstream.KeyValue, r Removal) error {
	key, err := removalKey(r.Host, r.ID)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(r)
	_, err = kv.Put(ctx, key, body)
	return err
}

// Removals lists what host still holds of sandboxes removed while it was lost, oldest first.
func Removals(ctx context.Context, kv jetstream.KeyValue, host string) ([]Removal, error) {
	if err := validHostName(host); err != nil {
		return nil, err
	}
	lister, err := kv.ListKeysFiltered(ctx, removedPrefix+host+".*")
	if err != nil {
		return nil, err
	}
	var out []Removal
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var r Removal
		if json.Unmarshal(e.Value(), &r) != nil || r.Host != host {
			continue
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Removal) int { return a.At.Compare(b.At) })
	return out, nil
}

// SettleRemoval forgets r once its host has removed everything of it.
func SettleRemoval(ctx context.Context, kv jetstream.KeyValue, r Removal) error {
	key, err := removalKey(r.Host, r.ID)
	if err != nil {
		return err
	}
	return kv.Purge(ctx, key)
}

// Drain marks host drained (on) or not: nothing new is placed on a drained host.
func Drain(ctx context.Context, kv jetstream.KeyValue, host string, on bool) error {
	if err := validHostName(host); err != nil {
		return err
	}
	if !on {
		err := kv.Delete(ctx, drainPrefix+host)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		return err
	}
	_, err := kv.Put(ctx, drainPrefix+host, []byte(time.Now().UTC().Format(time.RFC3339)))
	return err
}

// Place picks the host for a new sandbox of memMiB: of the hosts up and not drained whose
// labels include every one of want, the one with the most free memory that fits. ok is false
// when none fits; why then says what each host lacked.
func Place(hosts []HostState, memMiB int, want map[string]string) (host string, ok bool, why []string) {
	best := -1
	for i, h := range hosts {
		switch {
		case h.State != HostUp:
			why = append(why, h.Host+" is "+h.State)
			continue
		case !hasLabels(h.Labels, want):
			why = append(why, h.Host+" lacks the labels asked for")
			continue
		case h.FreeMiB() < memMiB:
			why = append(why, h.Host+" has too little free memory")
			continue
		}
		if best < 0 || h.FreeMiB() > hosts[best].FreeMiB() {
			best = i
		}
	}
	if best < 0 {
		return "", false, why
	}
	return hosts[best].Host, true, nil
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
