package gateway

import (
	"sort"
	"testing"
)

// A write this process makes while the watch's initial load is under way is in the listings
// once the load lands, even when the load was read before it (a create right after a gateway
// starts, or after a bus reconnect, was missing from ps until the watch caught up).
func TestRegistryCacheLoadKeepsOwnWrites(t *testing.T) {
	names := func(c *registryCache) []string {
		recs, ok := c.snapshot(false)
		if !ok {
			t.Fatal("the cache is not live after its load")
		}
		var out []string
		for _, r := range recs {
			out = append(out, r.name)
		}
		sort.Strings(out)
		return out
	}
	c := newRegistryCache()
	c.put("made-during-load", []byte(`{}`), 7)
	c.put("older-than-load", []byte(`{}`), 3)
	c.put("deleted-after", []byte(`{}`), 4)
	c.put("removed-here", []byte(`{}`), 2)
	c.remove("removed-here", 8)
	c.load(map[string]cached{
		"older-than-load": {name: "older-than-load", data: []byte(`{"x":1}`), rev: 5},
		"removed-here":    {name: "removed-here", data: []byte(`{}`), rev: 2},
		"other":           {name: "other", data: []byte(`{}`), rev: 1},
	}, map[string]uint64{"deleted-after": 6})
	got := names(c)
	want := []string{"made-during-load", "older-than-load", "other"}
	if len(got) != len(want) {
		t.Fatalf("listing after the load: %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("listing after the load: %v, want %v", got, want)
		}
	}
	recs, _ := c.snapshot(false)
	for _, r := range recs {
		if r.name == "older-than-load" && r.rev != 5 {
			t.Fatalf("the load's newer revision lost to an older own write: rev %d", r.rev)
		}
	}

	// What a cache held before it went stale is not carried into the next load: a record
	// removed meanwhile by another gateway must not come back.
	c.stale()
	c.load(map[string]cached{}, map[string]uint64{})
	if got := names(c); len(got) != 0 {
		t.Fatalf("records held before the cache went stale came back: %v", got)
	}
}
