package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
)

// The metrics the gateway serves at /metrics when --metrics-addr is set (docs/operations.md
// lists them). Every sandbox metric is labelled with its name and id.
var (
	metricCPU = prometheus.NewDesc("nexus_sandbox_cpu_seconds_total",
		"Host CPU time the sandbox's VM has used.", []string{"sandbox", "id"}, nil)
	metricMemory = prometheus.NewDesc("nexus_sandbox_memory_bytes",
		"Guest memory (kind=guest) and what the VM holds of the host's (kind=host_rss).", []string{"sandbox", "id", "kind"}, nil)
	metricDisk = prometheus.NewDesc("nexus_sandbox_disk_bytes",
		"Root disk: what it takes on the host (kind=used) and its size in the guest (kind=size).", []string{"sandbox", "id", "kind"}, nil)
	metricNet = prometheus.NewDesc("nexus_sandbox_network_bytes_total",
		"Bytes the sandbox's NIC sent (direction=out) and received (direction=in).", []string{"sandbox", "id", "direction"}, nil)
	metricConns = prometheus.NewDesc("nexus_sandbox_connections",
		"Forwarded connections the sandbox has open.", []string{"sandbox", "id"}, nil)
	metricSandboxes = prometheus.NewDesc("nexus_sandboxes",
		"Sandboxes in the registry by state.", []string{"state"}, nil)
	metricUp = prometheus.NewDesc("nexus_service_up",
		"1 for each service instance that answered on the bus, by service and host.", []string{"service", "host"}, nil)
)

// collector reads the figures at each scrape: nothing is kept between scrapes.
type collector struct{ g *Service }

func (c collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	if all, err := c.g.reg.List(ctx, nil); err == nil {
		by := map[api.State]int{}
		for _, sb := range all {
			by[sb.State]++
		}
		for st, n := range by {
			gauge(metricSandboxes, float64(n), string(st))
		}
	}
	if stats, err := c.g.stats(ctx, api.StatsRequest{}); err == nil {
		for _, s := range stats {
			counter(metricCPU, s.CPUSeconds, s.Name, s.ID)
			gauge(metricMemory, float64(s.MemoryMiB)*(1<<20), s.Name, s.ID, "guest")
			gauge(metricMemory, float64(s.RSSBytes), s.Name, s.ID, "host_rss")
			gauge(metricDisk, float64(s.DiskUsedBytes), s.Name, s.ID, "used")
			gauge(metricDisk, float64(s.DiskSizeBytes), s.Name, s.ID, "size")
			counter(metricNet, float64(s.NetOutBytes), s.Name, s.ID, "out")
			counter(metricNet, float64(s.NetInBytes), s.Name, s.ID, "in")
			gauge(metricConns, float64(s.Connections), s.Name, s.ID)
		}
	}
	if infos, err := bus.Discover(ctx, c.g.cfg.Bus, 500*time.Millisecond, 0); err == nil {
		seen := map[[2]string]bool{}
		for _, info := range infos {
			k := [2]string{info.Name[len(bus.ServicePrefix):], info.Metadata[bus.MetaHost]}
			if !seen[k] {
				seen[k] = true
				gauge(metricUp, 1, k[0], k[1])
			}
		}
	}
}

// serveMetrics serves /metrics on ln until ctx ends.
func (g *Service) serveMetrics(ctx context.Context, ln net.Listener) error {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collector{g}); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Timeout: 10 * time.Second}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	g.log.Info().Str("addr", ln.Addr().String()).Msg("metrics at /metrics")
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
