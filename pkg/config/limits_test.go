package config

import (
	"errors"
	"strings"
	"testing"

	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/errdefs"
)

func TestParseLimits(t *testing.T) {
	c, err := Parse("c.yaml", []byte("version: 1\negress:\n  limits:\n    max_conns: 64\n    conn_rate: 20\n    dns_rate: 10\n    egress_bandwidth: 10m\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := netapi.Limits{MaxConns: 64, ConnRate: 20, DNSRate: 10, EgressBandwidth: 10 << 20}
	if c.Egress.Limits != want {
		t.Fatalf("limits %+v, want %+v", c.Egress.Limits, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"max_conns: 5000", "c.yaml:4: egress.limits.max_conns: 5000 is above the default 1024; a project config may only lower a budget (raise it with --max-conns)"},
		{"egress_bandwidth: 1g", "c.yaml:4: egress.limits.egress_bandwidth: 1073741824 is above the default 104857600; a project config may only lower a budget (raise it with --egress-bandwidth)"},
		{"dns_rate: 0", `c.yaml:4: egress.limits.dns_rate: "0" is not a positive whole number`},
		{"conn_rate: lots", `c.yaml:4: egress.limits.conn_rate: "lots" is not a positive whole number`},
		{"egress_bandwidth: fast", `c.yaml:4: egress.limits.egress_bandwidth: "fast" is not a size per second: use a unit, as in 10m or 500k`},
		{"max_con: 3", `c.yaml:4: unknown key "max_con" in egress.limits`},
	} {
		_, err := Parse("c.yaml", []byte("version: 1\negress:\n  limits:\n    "+tc.yaml+"\n"))
		if err == nil || !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
	}
	// A config that arrives over the bus is held to the same ceiling.
	raised := &Config{Version: Version, Egress: Egress{Limits: netapi.Limits{ConnRate: 10_000}}}
	if err := raised.Validate(); err == nil || !strings.Contains(err.Error(), "egress.limits.conn_rate: 10000 is above the default") {
		t.Fatalf("validate raised limits: %v", err)
	}
}
