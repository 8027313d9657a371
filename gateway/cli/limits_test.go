package cli

import (
	"testing"

	"github.com/spf13/pflag"

	netapi "github.com/IniZio/nexus/pkg/api/netstack"
)

func TestLimitFlags(t *testing.T) {
	var l netapi.Limits
	f := pflag.NewFlagSet("create", pflag.ContinueOnError)
	limitFlags(f, &l)
	if err := f.Parse([]string{"--max-conns", "64", "--conn-rate", "20", "--dns-rate", "10", "--egress-bandwidth", "512k"}); err != nil {
		t.Fatal(err)
	}
	if want := (netapi.Limits{MaxConns: 64, ConnRate: 20, DNSRate: 10, EgressBandwidth: 512 << 10}); l != want {
		t.Fatalf("limits %+v, want %+v", l, want)
	}
	for _, bad := range []string{"fast", "0", "-1m"} {
		if err := f.Parse([]string{"--egress-bandwidth", bad}); err == nil {
			t.Errorf("--egress-bandwidth %s accepted", bad)
		}
	}
	if err := f.Parse([]string{"--egress-bandwidth", "2"}); err != nil || l.EgressBandwidth != 2<<20 {
		t.Errorf("plain number is MiB: %d %v", l.EgressBandwidth, err)
	}
}
