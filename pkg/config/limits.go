package config

import (
	"strconv"

	"gopkg.in/yaml.v3"

	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/bytesize"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// egress.limits: the sandbox's egress budgets (netapi.Limits). The file lives in a work tree the
// agent can write, so it may only lower a budget below the default; the create flags
// (--max-conns, --conn-rate, --dns-rate, --egress-bandwidth, --ingress-bandwidth) may raise one.
//
//	egress:
//	  limits:
//	    max_conns: 256
//	    conn_rate: 50
//	    dns_rate: 50
//	    egress_bandwidth: 10m
//	    ingress_bandwidth: 50m

func (p *parser) limits(n *yaml.Node, l *netapi.Limits) error {
	count := func(key string, dst *int) func(k, v *yaml.Node) error {
		return func(_, v *yaml.Node) error {
			s, err := p.scalar(v, "egress.limits."+key)
			if err != nil {
				return err
			}
			k, err := strconv.Atoi(s)
			if err != nil || k <= 0 {
				return p.errf(v, "egress.limits.%s: %q is not a positive whole number", key, clip(s))
			}
			*dst = k
			return nil
		}
	}
	size := func(key string, dst *int64) func(k, v *yaml.Node) error {
		return func(_, v *yaml.Node) error {
			s, err := p.scalar(v, "egress.limits."+key)
			if err != nil {
				return err
			}
			b, err := bytesize.Parse(s, bytesize.MiB)
			if err != nil || b <= 0 {
				return p.errf(v, "egress.limits.%s: %q is not a size per second: use a unit, as in 10m or 500k", key, clip(s))
			}
			*dst = b
			return nil
		}
	}
	err := p.mapping(n, "egress.limits", map[string]func(k, v *yaml.Node) error{
		"max_conns":         count("max_conns", &l.MaxConns),
		"conn_rate":         count("conn_rate", &l.ConnRate),
		"dns_rate":          count("dns_rate", &l.DNSRate),
		"egress_bandwidth":  size("egress_bandwidth", &l.EgressBandwidth),
		"ingress_bandwidth": size("ingress_bandwidth", &l.IngressBandwidth),
	})
	if err != nil {
		return err
	}
	if msg := aboveDefault(*l); msg != "" {
		return p.errf(n, "%s", msg)
	}
	return nil
}

// aboveDefault says which budget of l is above its default, or "".
func aboveDefault(l netapi.Limits) string {
	d := netapi.DefaultLimits
	for _, c := range []struct {
		key, flag string
		v, def    int64
	}{
		{"max_conns", "max-conns", int64(l.MaxConns), int64(d.MaxConns)},
		{"conn_rate", "conn-rate", int64(l.ConnRate), int64(d.ConnRate)},
		{"dns_rate", "dns-rate", int64(l.DNSRate), int64(d.DNSRate)},
		{"egress_bandwidth", "egress-bandwidth", l.EgressBandwidth, d.EgressBandwidth},
		{"ingress_bandwidth", "ingress-bandwidth", l.IngressBandwidth, d.IngressBandwidth},
	} {
		if c.v > c.def {
			return "egress.limits." + c.key + ": " + strconv.FormatInt(c.v, 10) + " is above the default " + strconv.FormatInt(c.def, 10) +
				"; a project config may only lower a budget (raise it with --" + c.flag + ")"
		}
	}
	return ""
}

// checkLimits is Validate's check of egress.limits (a config that came over the bus).
func checkLimits(l netapi.Limits) error {
	if err := l.Validate(); err != nil {
		return errdefs.Invalid("nexus config: egress.limits: %v", err)
	}
	if msg := aboveDefault(l); msg != "" {
		return errdefs.Invalid("nexus config: %s", msg)
	}
	return nil
}
