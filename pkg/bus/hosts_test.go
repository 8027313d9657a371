package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
)

func init() {
	permMatrix = append(permMatrix,
		permCase{what: "heartbeat its own host", subject: "$KV." + bus.KVHosts + "." + bus.LocalHost, body: `{}`, allowed: []string{bus.UserVMM}},
		permCase{what: "heartbeat another host", subject: "$KV." + bus.KVHosts + ".other", body: `{}`},
		permCase{what: "drain a host", subject: "$KV." + bus.KVHosts + ".drain.other", body: `x`, allowed: []string{bus.UserCLI, bus.UserAPI}},
		permCase{what: "read host heartbeats", subject: kvGet(bus.KVHosts), allowed: []string{bus.UserGateway, bus.UserCLI, bus.UserAPI}},
	)
}

// TestHostsAndPlacement: heartbeats list with their state (up, draining, lost) and placement
// takes the host up and undrained with the most free memory that fits and has the labels.
func TestHostsAndPlacement(t *testing.T) {
	b := testutil.NewBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := bus.KV(ctx, b.Connect(t, bus.UserAdmin), bus.KVHosts)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, hb := range []bus.HostBeat{
		{Host: "a", MemoryMiB: 4000, MemoryUsedMiB: 3000, At: now, Labels: map[string]string{"zone": "a"}},
		{Host: "b", MemoryMiB: 4000, MemoryUsedMiB: 1000, At: now, Labels: map[string]string{"zone": "b"}},
		{Host: "c", MemoryMiB: 8000, At: now.Add(-time.Minute)}, // lost
		{Host: "d", MemoryMiB: 8000, At: now},                   // drained below
	} {
		if err := bus.Beat(ctx, kv, hb); err != nil {
			t.Fatal(err)
		}
	}
	if err := bus.Drain(ctx, kv, "d", true); err != nil {
		t.Fatal(err)
	}
	hs, err := bus.Hosts(ctx, kv, now)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, h := range hs {
		states[h.Host] = h.State
	}
	if want := map[string]string{"a": bus.HostUp, "b": bus.HostUp, "c": bus.HostLost, "d": bus.HostDraining}; len(states) != 4 ||
		states["a"] != want["a"] || states["b"] != want["b"] || states["c"] != want["c"] || states["d"] != want["d"] {
		t.Fatalf("states %v, want %v", states, want)
	}
	for _, c := range []struct {
		mem    int
		labels map[string]string
		want   string
	}{
		{512, nil, "b"},
		{512, map[string]string{"zone": "a"}, "a"},
		{2000, map[string]string{"zone": "a"}, ""},
		{3500, nil, ""},
	} {
		got, ok, why := bus.Place(hs, c.mem, c.labels)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("place %d MiB %v: %q (%v), want %q", c.mem, c.labels, got, why, c.want)
		}
	}
	if err := bus.Drain(ctx, kv, "d", false); err != nil {
		t.Fatal(err)
	}
	if hs, _ := bus.Hosts(ctx, kv, now); hs[3].State != bus.HostUp {
		t.Errorf("undrained d is %s", hs[3].State)
	}
}
