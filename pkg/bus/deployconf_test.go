package bus

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"net/url"
	"os"
	"testing"

	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/IniZio/nexus/pkg/home"
)

// TestDeployNodeConf keeps deploy/cluster in step with the node nexus runs: the example
// cluster.json is one LoadCluster reads (no unknown field), and nats-node.conf, the options
// written out for operators, has the server name, ports, routes and TLS that clusterOptions
// makes of it.
func TestDeployNodeConf(t *testing.T) {
	b, err := os.ReadFile("../../deploy/cluster/cluster.json.example")
	if err != nil {
		t.Fatal(err)
	}
	var cl Cluster
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cl); err != nil {
		t.Fatalf("cluster.json.example: %v", err)
	}
	h := home.Dir(t.TempDir())
	if err := NewCA(h, cl.Name); err != nil {
		t.Fatal(err)
	}
	key, err := NewNodeKey(h)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := SignNode(h, cl.Host, []string{cl.Advertise}, key.Public())
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteNodeCert(h, cert, CAPEM(h)); err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{}
	if err := clusterOptions(h, cl, opts); err != nil {
		t.Fatal(err)
	}
	m, err := conf.ParseFile("../../deploy/cluster/nats-node.conf")
	if err != nil {
		t.Fatalf("nats-node.conf: %v", err)
	}
	cm, _ := m["cluster"].(map[string]any)
	routes, _ := cm["routes"].([]any)
	ctls, _ := cm["tls"].(map[string]any)
	var routeHosts []string
	for _, r := range routes {
		u, err := url.Parse(r.(string))
		if err != nil {
			t.Fatalf("nats-node.conf route %v: %v", r, err)
		}
		routeHosts = append(routeHosts, u.Host)
	}
	var wantRoutes []string
	for _, u := range opts.Routes {
		wantRoutes = append(wantRoutes, u.Host)
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"server_name", m["server_name"], opts.ServerName},
		{"host", m["host"], opts.Host},
		{"port", m["port"], int64(opts.Port)},
		{"client tls", m["tls"] != nil, opts.TLSConfig != nil},
		{"max_payload", m["max_payload"], int64(8 << 20)},
		{"cluster.name", cm["name"], opts.Cluster.Name},
		{"cluster.host", cm["host"], opts.Cluster.Host},
		{"cluster.port", cm["port"], int64(opts.Cluster.Port)},
		{"cluster.advertise", cm["advertise"], opts.Cluster.Advertise},
		{"cluster.tls.verify (mutual TLS)", ctls["verify"], opts.Cluster.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert},
		{"cluster.routes", fmtList(routeHosts), fmtList(wantRoutes)},
	} {
		if c.got != c.want {
			t.Errorf("nats-node.conf %s: %v (%T); the node runs %v", c.what, c.got, c.got, c.want)
		}
	}
}

func fmtList(s []string) string { b, _ := json.Marshal(s); return string(b) }
