package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// LeaseEvery is how often a holder refreshes its lease. The bucket forgets a lease that was
// not refreshed for bus.LeaseTTL, and the gateway then removes the ephemeral sandbox.
const LeaseEvery = time.Second

// LeaseRecord is the value of a lease key (informational: only the key's presence counts).
type LeaseRecord struct {
	PID     int       `json:"pid"`
	Renewed time.Time `json:"renewed"`
}

var leaseKeyRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Lease is a caller's hold on an ephemeral sandbox: the key <sandbox id> in KV nexus_leases,
// refreshed every LeaseEvery until Release. When the holder dies, even by SIGKILL, the key
// lapses after bus.LeaseTTL and the gateway's watchdog tears the sandbox down.
type Lease struct {
	kv     jetstream.KeyValue
	id     string
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// HoldLease takes the lease of sandbox id: the first refresh happens before it returns (an
// error means no lease is held), later ones in the background until Release or ctx ends.
func (c *Client) HoldLease(ctx context.Context, id string) (*Lease, error) {
	if !leaseKeyRE.MatchString(id) {
		return nil, errdefs.Invalid("lease: invalid sandbox id %q", id)
	}
	kv, err := bus.KV(ctx, c.nc, bus.KVLeases)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", id, err)
	}
	l := &Lease{kv: kv, id: id, done: make(chan struct{})}
	if err := l.renew(ctx); err != nil {
		return nil, fmt.Errorf("lease %s: %w", id, err)
	}
	lctx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	go func() {
		defer close(l.done)
		t := time.NewTicker(LeaseEvery)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
				// A failed refresh is retried on the next tick; only bus.LeaseTTL of
				// failures in a row lets the lease lapse.
				l.renew(lctx)
			}
		}
	}()
	return l, nil
}

func (l *Lease) renew(ctx context.Context) error {
	b, _ := json.Marshal(LeaseRecord{PID: os.Getpid(), Renewed: time.Now().UTC()})
	rctx, cancel := context.WithTimeout(ctx, LeaseEvery)
	defer cancel()
	_, err := l.kv.Put(rctx, l.id, b)
	return err
}

// Release stops refreshing and deletes the key. Call it after the sandbox is removed.
func (l *Lease) Release() {
	l.once.Do(func() {
		l.cancel()
		<-l.done
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		l.kv.Delete(ctx, l.id)
	})
}

// Stop stops refreshing without deleting the key (it lapses after bus.LeaseTTL).
func (l *Lease) Stop() {
	l.cancel()
	<-l.done
}
