package testutil

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

// BusCluster is a cluster of bus nodes on loopback, each with its own home, made the way an
// operator makes one: the first node ran `nexus cluster init` (it holds the CA and is a control
// host), the others joined with a token as `nexus cluster join` does (workers), and every client
// connection and route speaks TLS against the cluster CA. Nodes[i].Connect connects to node i
// with that node's credentials.
type BusCluster struct {
	Nodes []*Bus
}

// clusterHosts are the nodes' host names in order.
var clusterHosts = []string{"a", "b", "c", "d", "e"}

// StartBusCluster starts a cluster of n nodes (1 to 5) with homes under dir and returns once
// every node's store serves, with the buckets and streams at bus.ClusterReplicas copies when n
// is three or more (a lone node has no quorum: n is at least two). The caller must Shutdown it.
func StartBusCluster(ctx context.Context, dir string, n int) (_ *BusCluster, err error) {
	if n < 2 || n > len(clusterHosts) {
		return nil, fmt.Errorf("testutil: a bus cluster of %d nodes: between 2 and %d", n, len(clusterHosts))
	}
	c := &BusCluster{}
	defer func() {
		if err != nil {
			c.Shutdown()
		}
	}()
	ports := func() (client, route int, err error) {
		if client, err = BusPort(); err == nil {
			route, err = BusPort()
		}
		return client, route, err
	}
	first := home.Dir(filepath.Join(dir, clusterHosts[0]))
	client, route, err := ports()
	if err != nil {
		return nil, err
	}
	if _, err := bus.Init(bus.InitConfig{Home: first, Name: "test", Host: clusterHosts[0], Advertise: "127.0.0.1", Listen: "127.0.0.1",
		ClientPort: client, RoutePort: route}); err != nil {
		return nil, err
	}
	if err := c.start(ctx, first); err != nil {
		return nil, err
	}
	cl, _, err := bus.LoadCluster(first)
	if err != nil {
		return nil, err
	}
	_, token, err := bus.CreateToken(first, []string{cl.ClientURL()}, time.Hour)
	if err != nil {
		return nil, err
	}
	for _, host := range clusterHosts[1:n] {
		h := home.Dir(filepath.Join(dir, host))
		client, route, err := ports()
		if err != nil {
			return nil, err
		}
		// The first node admits a new token's user within a second or so.
		if err := Poll(time.Minute, func() error {
			_, err := bus.Join(ctx, bus.JoinConfig{Home: h, Token: token, Host: host, Advertise: "127.0.0.1", Listen: "127.0.0.1",
				ClientPort: client, RoutePort: route})
			return err
		}); err != nil {
			return nil, fmt.Errorf("testutil: host %s joins the cluster: %w", host, err)
		}
		if err := c.start(ctx, h); err != nil {
			return nil, err
		}
	}
	for i, b := range c.Nodes {
		if err := b.Server.WaitStore(ctx); err != nil {
			return nil, fmt.Errorf("testutil: the store of node %s: %w", clusterHosts[i], err)
		}
	}
	if n < bus.ClusterReplicas {
		return c, nil
	}
	// The meta leader raises the buckets and streams to R3 once it counts three peers.
	admin, err := bus.Connect(ctx, bus.ConnectConfig{Home: first, User: bus.UserAdmin, URL: c.Nodes[0].URL})
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	for _, st := range []string{bus.StreamAudit, bus.StreamEvents, "KV_" + bus.KVSandboxes, "KV_" + bus.KVHosts, "KV_" + bus.KVLeases,
		"KV_" + bus.KVPorts, "KV_" + bus.KVSnapshots} {
		if err := Poll(2*time.Minute, func() error {
			rctx, cancel := bus.StoreContext(ctx)
			defer cancel()
			r, err := bus.Replicas(rctx, admin, st)
			if err == nil && r != bus.ClusterReplicas {
				err = fmt.Errorf("%s has %d replicas", st, r)
			}
			return err
		}); err != nil {
			return nil, fmt.Errorf("testutil: the cluster's store at R%d: %w", bus.ClusterReplicas, err)
		}
	}
	return c, nil
}

func (c *BusCluster) start(ctx context.Context, h home.Dir) error {
	s, err := bus.StartServer(ctx, bus.ServerConfig{Home: h, Log: zerolog.Nop()})
	if err != nil {
		return err
	}
	c.Nodes = append(c.Nodes, &Bus{Home: h, URL: s.URL(), Server: s})
	return nil
}

// NewBusCluster starts a cluster of n nodes for t (StartBusCluster), shut down at cleanup. Like
// NewBus it points HOME and NEXUS_HOME at temp dirs first.
func NewBusCluster(t testing.TB, n int) *BusCluster {
	t.Helper()
	if testing.Short() {
		t.Skipf("a bus cluster of %d nodes", n)
	}
	IsolateHome(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := StartBusCluster(ctx, t.TempDir(), n)
	if err != nil {
		t.Fatalf("start bus cluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

// Shutdown stops every node, the last started first.
func (c *BusCluster) Shutdown() {
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		c.Nodes[i].Server.Shutdown()
	}
	c.Nodes = nil
}
