package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

// TestPlacement: a create goes to the host up and undrained with the most free memory that
// fits and has the labels asked for, to --host when it is up, and to the gateway's own host
// when it mounts a host path; a lost host takes nothing; a single host is the gateway's own.
func TestPlacement(t *testing.T) {
	tg := newTestGateway(t)
	prof, err := profile.Get(profile.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	place := func(r api.CreateRequest, sb *api.Sandbox) (string, error) {
		sb.Name, sb.MemoryMiB = "p", 1024
		err := tg.place(tg.ctx, sb, r, prof)
		return sb.Host, err
	}
	// No heartbeats: the gateway's host, as on one machine.
	if h, err := place(api.CreateRequest{}, &api.Sandbox{}); err != nil || h != bus.LocalHost {
		t.Fatalf("without heartbeats: %q, %v", h, err)
	}
	kv, err := bus.KV(tg.ctx, tg.bus.Connect(t, bus.UserAdmin), bus.KVHosts)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, b := range []bus.HostBeat{
		{Host: bus.LocalHost, MemoryMiB: 4096, MemoryUsedMiB: 2048, At: now},
		{Host: "b", MemoryMiB: 8192, MemoryUsedMiB: 1024, At: now, Labels: map[string]string{"zone": "b"}},
		{Host: "c", MemoryMiB: 65536, At: now.Add(-time.Minute)},
	} {
		if err := bus.Beat(tg.ctx, kv, b); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		what string
		r    api.CreateRequest
		sb   api.Sandbox
		want string
		err  string
	}{
		{what: "most free memory", want: "b"},
		{what: "labels", r: api.CreateRequest{HostLabels: map[string]string{"zone": "b"}}, want: "b"},
		{what: "--host", r: api.CreateRequest{Host: bus.LocalHost}, want: bus.LocalHost},
		{what: "a mount pins to the gateway's host", sb: api.Sandbox{Mounts: []api.Mount{{Host: "/src", Guest: "/src"}}}, want: bus.LocalHost},
		{what: "a mount and another host", r: api.CreateRequest{Host: "b"}, sb: api.Sandbox{Mounts: []api.Mount{{Host: "/src", Guest: "/src"}}}, err: "its --mount paths are on host local"},
		{what: "a lost host", r: api.CreateRequest{Host: "c"}, err: "host c is lost"},
		{what: "an unknown host", r: api.CreateRequest{Host: "z"}, err: "no host z"},
		{what: "labels none has", r: api.CreateRequest{HostLabels: map[string]string{"zone": "q"}}, err: "no host can take sandbox p"},
	} {
		h, err := place(c.r, &c.sb)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %q, %v; want an error with %q", c.what, h, err, c.err)
		case c.err == "" && (err != nil || h != c.want):
			t.Errorf("%s: %q, %v; want %s", c.what, h, err, c.want)
		}
	}
	// Draining b sends the next create to the other host up.
	if err := bus.Drain(tg.ctx, kv, "b", true); err != nil {
		t.Fatal(err)
	}
	if h, err := place(api.CreateRequest{}, &api.Sandbox{}); err != nil || h != bus.LocalHost {
		t.Errorf("with b drained: %q, %v", h, err)
	}
	if _, err := place(api.CreateRequest{Host: "b"}, &api.Sandbox{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("--host b while drained: %v", err)
	}
}
