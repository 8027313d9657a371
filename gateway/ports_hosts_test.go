package gateway

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestPortsOfEveryHost: `nexus ports` without a name lists the forwards of every host a
// sandbox is on, each row naming its host; with a name, those of that sandbox's host.
func TestPortsOfEveryHost(t *testing.T) {
	tg := newTestGateway(t)
	tg.add(t, &api.Sandbox{Name: "default/here"}, api.StateRunning)
	there := tg.add(t, &api.Sandbox{Name: "default/there", Host: "b"}, api.StateRunning)
	nc := tg.bus.Connect(t, bus.UserAdmin)
	for host, f := range map[string]portfwdapi.Forward{
		bus.LocalHost: {Sandbox: "default/here", Port: 5173, State: "forwarding", Host: bus.LocalHost},
		"b":           {Sandbox: "default/there", Port: 8080, State: "forwarding", Host: "b"},
	} {
		sub, err := nc.Subscribe(portfwdapi.List.Subject(host), func(m *nats.Msg) {
			var r portfwdapi.ListRequest
			json.Unmarshal(m.Data, &r)
			list := []portfwdapi.Forward{f}
			if r.ID != "" && r.ID != there.ID {
				list = nil
			}
			b, _ := bus.EncodeOK(list)
			m.Respond(b)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
	}
	nc.Flush()
	all, err := tg.ports(context.Background(), api.PortsRequest{})
	if err != nil || len(all) != 2 || all[0].Host != bus.LocalHost || all[1].Host != "b" || all[1].Port != 8080 {
		t.Fatalf("ports of every host: %+v, %v; want here's on %s and there's on b", all, err, bus.LocalHost)
	}
	one, err := tg.ports(context.Background(), api.PortsRequest{Name: "there"})
	if err != nil || len(one) != 1 || one[0].Host != "b" {
		t.Fatalf("ports of there: %+v, %v; want its forward on host b", one, err)
	}
}
