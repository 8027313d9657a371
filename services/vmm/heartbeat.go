package vmm

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/IniZio/nexus/pkg/bus"
)

// heartbeat writes this host's capacity into nexus_hosts every bus.HeartbeatEvery until ctx
// ends: what sandboxes may take here, what the running ones hold, cores, free disk. The gateway
// places new sandboxes by it; a host whose heartbeat stops is lost (DESIGN §10).
func (s *Service) heartbeat(ctx context.Context) {
	var kv jetstream.KeyValue
	warned := false
	tick := time.NewTicker(bus.HeartbeatEvery)
	defer tick.Stop()
	for {
		if kv == nil {
			bctx, cancel := bus.StoreContext(ctx)
			k, err := bus.KV(bctx, s.cfg.Bus, bus.KVHosts)
			cancel()
			if err == nil {
				kv = k
			} else if !warned {
				warned = true
				s.log.Warn().Err(err).Msg("no host heartbeat yet: nexus_hosts is not there (a bus from an older nexus?)")
			}
		}
		if kv != nil {
			bctx, cancel := bus.StoreContext(ctx)
			if err := bus.Beat(bctx, kv, s.capacity()); err != nil && ctx.Err() == nil {
				s.log.Debug().Err(err).Msg("host heartbeat")
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// capacity is this host's heartbeat as of now.
func (s *Service) capacity() bus.HostBeat {
	a := s.cfg.Admission
	b := bus.HostBeat{Host: s.cfg.Host, Version: s.cfg.Version, MemoryMiB: int(float64(a.HostMemoryMiB) * a.MemoryShare),
		VCPUs: a.HostCores, Labels: s.cfg.Labels, At: time.Now().UTC(), TTL: bus.HostTTL}
	s.mu.Lock()
	for _, m := range s.vms {
		b.MemoryUsedMiB += m.vm.Spec().MemoryMiB + VMOverheadMiB
		b.Running++
	}
	for _, mib := range s.reserved {
		b.MemoryUsedMiB += mib
	}
	s.mu.Unlock()
	if sp, err := s.cfg.Home.Space(); err == nil {
		b.DiskFree, b.DiskTotal = sp.Free, sp.Total
	}
	return b
}
