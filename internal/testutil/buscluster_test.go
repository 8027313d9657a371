package testutil_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestBusCluster: the three nodes are one cluster with its store at R3: an audit event a worker
// host's netstack publishes on its own node is read by the CLI on the first node.
func TestBusCluster(t *testing.T) {
	c := testutil.NewBusCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r, err := bus.Replicas(ctx, c.Nodes[0].Connect(t, bus.UserAdmin), bus.StreamAudit); err != nil || r != bus.ClusterReplicas {
		t.Fatalf("the audit stream has %d replicas (%v), want %d", r, err, bus.ClusterReplicas)
	}
	p, err := audit.NewPublisher(c.Nodes[2].Connect(t, bus.UserNetstack), bus.UserNetstack, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	p.Emit(ctx, audit.Event{Sandbox: "sb-c", Layer: audit.LayerDNS, Host: "on-c.example", Decision: audit.Deny, Rule: "dns_not_allowed"})
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var got []audit.Event
	if err := audit.Tail(ctx, c.Nodes[0].Connect(t, bus.UserCLI), audit.TailOptions{Sandboxes: []string{"sb-c"}}, func(ev audit.Event) error {
		got = append(got, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Host != "on-c.example" {
		t.Fatalf("node a reads %+v of what node c's netstack published", got)
	}
}
