package mcp

import (
	"strings"
	"testing"

	netapi "github.com/IniZio/nexus/pkg/api/netstack"
)

// sandbox_create's disk and budget arguments take the sizes `nexus create` takes.
func TestCreateArgsSizes(t *testing.T) {
	a := createArgs{Disk: "20g", DiskBps: "8m", MaxConns: 64, ConnRate: 20, DNSRate: 10, EgressBW: "10m", IngressBW: "512k"}
	disk, bps, l, err := a.sizes()
	if err != nil {
		t.Fatal(err)
	}
	if want := (netapi.Limits{MaxConns: 64, ConnRate: 20, DNSRate: 10, EgressBandwidth: 10 << 20, IngressBandwidth: 512 << 10}); disk != 20<<10 || bps != 8<<20 || l != want {
		t.Fatalf("disk %d, disk_bps %d, limits %+v", disk, bps, l)
	}
	if disk, _, _, err := (createArgs{Disk: "4096"}).sizes(); err != nil || disk != 4096 {
		t.Fatalf("plain MiB disk: %d %v", disk, err)
	}
	for _, c := range []struct {
		a    createArgs
		want string
	}{
		{createArgs{Disk: "lots"}, "disk: "},
		{createArgs{IngressBW: "0"}, `ingress_bandwidth: "0" is not a size per second`},
		{createArgs{EgressBW: "fast"}, `egress_bandwidth: "fast" is not a size per second`},
		{createArgs{DiskBps: "-1m"}, `disk_bps: "-1m" is not a size per second`},
	} {
		if _, _, _, err := c.a.sizes(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.a, err, c.want)
		}
	}
}
