package portfwd

import (
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"time"

	api "github.com/IniZio/nexus/pkg/api/portfwd"
)

// kvTimeout bounds one KV operation.
const kvTimeout = 5 * time.Second

// key is the KV nexus_ports key of one forward: <id>.<port>.
func key(id string, port uint16) string { return id + "." + strconv.Itoa(int(port)) }

func (s *Service) store(ctx context.Context, f *forward) {
	b, _ := json.Marshal(s.record(f))
	// A handled event completes even when the service is told to stop meanwhile.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), kvTimeout)
	defer cancel()
	if _, err := s.kv.Put(ctx, key(f.id, f.port), b); err != nil {
		s.log.Warn().Err(err).Str("sandbox", f.name).Uint16("port", f.port).Msg("record forward")
	}
}

func (s *Service) unstore(ctx context.Context, f *forward) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), kvTimeout)
	defer cancel()
	if err := s.kv.Delete(ctx, key(f.id, f.port)); err != nil {
		s.log.Warn().Err(err).Str("sandbox", f.name).Uint16("port", f.port).Msg("delete forward record")
	}
}

// restore binds again the forwards this host recorded in KV in an earlier run, oldest first, so the
// same sandbox keeps a contested port. A sandbox whose last lifecycle event says it is no
// longer running loses its records; the others wait for a listener set to confirm them
// (RestoreGrace).
func (s *Service) restore(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lister, err := s.kv.ListKeys(lctx)
	if err != nil {
		s.log.Warn().Err(err).Msg("restore forwards: list keys")
		return
	}
	var recs []api.Forward
	for k := range lister.Keys() {
		e, err := s.kv.Get(lctx, k)
		if err != nil {
			continue
		}
		var r api.Forward
		if json.Unmarshal(e.Value(), &r) != nil || !idRE.MatchString(r.ID) || !api.InRange(int(r.Port)) || key(r.ID, r.Port) != k {
			s.kv.Delete(lctx, k)
			continue
		}
		if !s.ours(r.Host) {
			continue // another host's forward, in the cluster's shared bucket
		}
		recs = append(recs, r)
	}
	sort.SliceStable(recs, func(i, j int) bool {
		if (recs[i].State == api.StateForwarding) != (recs[j].State == api.StateForwarding) {
			return recs[i].State == api.StateForwarding
		}
		return recs[i].Since.Before(recs[j].Since)
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for _, r := range recs {
		sb, known := s.sandboxes[r.ID]
		if !known {
			sb = s.sandbox(r.ID, r.Sandbox)
			sb.state, sb.checked = s.lastState(ctx, r.ID), true
			sb.want = map[uint16]string{}
			sb.restoredAt = now
		}
		if !active(sb.state) {
			s.kv.Delete(lctx, key(r.ID, r.Port))
			continue
		}
		sb.want[r.Port] = r.GuestAddr
		// Claimed afresh (state ""): a port that was forwarding may be taken meanwhile.
		sb.fwds[r.Port] = &forward{id: r.ID, name: sb.name, port: r.Port, addr: r.GuestAddr, since: r.Since}
		s.claim(ctx, sb, r.Port)
	}
	for id, sb := range s.sandboxes {
		if len(sb.fwds) == 0 && !active(sb.state) {
			delete(s.sandboxes, id)
		}
	}
	if len(recs) > 0 {
		s.log.Info().Int("records", len(recs)).Int("forwarding", len(s.byPort)).Msg("restored forwards")
	}
}
