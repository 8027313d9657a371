package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/pflag"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/bytesize"
)

// mibValue is a size flag held in MiB: --memory 4g, 512m, or plain MiB.
type mibValue struct{ p *int }

func (v mibValue) String() string {
	if v.p == nil || *v.p == 0 {
		return ""
	}
	return strconv.Itoa(*v.p)
}
func (v mibValue) Type() string { return "size" }
func (v mibValue) Set(s string) error {
	n, err := bytesize.ParseMiB(s)
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

// bytesValue is a size flag held in bytes: 10m, 500k, or plain MiB.
type bytesValue struct{ p *int64 }

func (v bytesValue) String() string {
	if v.p == nil || *v.p == 0 {
		return ""
	}
	return strconv.FormatInt(*v.p, 10)
}
func (v bytesValue) Type() string { return "size" }
func (v bytesValue) Set(s string) error {
	n, err := bytesize.Parse(s, bytesize.MiB)
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("%q is not a positive size", s)
	}
	*v.p = n
	return nil
}

// limitFlags declares the egress budget flags of create on f, into l.
func limitFlags(f *pflag.FlagSet, l *netapi.Limits) {
	d := netapi.DefaultLimits
	f.IntVar(&l.MaxConns, "max-conns", 0, fmt.Sprintf("egress: most TCP connections and UDP flows open at once (default %d)", d.MaxConns))
	f.IntVar(&l.ConnRate, "conn-rate", 0, fmt.Sprintf("egress: most new connections per second (default %d)", d.ConnRate))
	f.IntVar(&l.DNSRate, "dns-rate", 0, fmt.Sprintf("egress: most DNS queries per second (default %d)", d.DNSRate))
	f.Var(bytesValue{&l.EgressBandwidth}, "egress-bandwidth", fmt.Sprintf("egress: most bytes sent out per second, a size such as 10m (default %dm)", d.EgressBandwidth>>20))
	f.Var(bytesValue{&l.IngressBandwidth}, "ingress-bandwidth", fmt.Sprintf("most bytes per second the guest receives from outside, a size such as 10m (default %dm)", d.IngressBandwidth>>20))
}

// memoryFlag declares --memory on f, into p (MiB).
func memoryFlag(f *pflag.FlagSet, p *int) {
	f.Var(mibValue{p}, "memory", "memory: a size such as 512m or 4g, or plain MiB (default 1024 MiB)")
}

// diskRateFlags declares --disk-bps and --disk-iops on f, into bps (bytes per second) and iops.
func diskRateFlags(f *pflag.FlagSet, bps *int64, iops *int) {
	f.Var(bytesValue{bps}, "disk-bps", fmt.Sprintf("disk: most bytes read, and apart written, per second, all its disks together; a size such as 64m (default %dm)", api.DefaultDiskBps>>20))
	f.IntVar(iops, "disk-iops", 0, fmt.Sprintf("disk: most reads, and apart writes, per second, all its disks together (default %d)", api.DefaultDiskIOPS))
}

// diskFlag declares --disk on f, into p (MiB).
func diskFlag(f *pflag.FlagSet, p *int) {
	f.Var(mibValue{p}, "disk", "root disk: a size such as 20g, or plain MiB, at least the image's; sparse, checked against the host's free space (default: the image's own size)")
}
