package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LeaseTTL is how long a lease in nexus_leases lives without a refresh (its holder refreshes
// it every second).
const LeaseTTL = 5 * time.Second

// AuditPerSubject is how many events the audit stream keeps per subject, that is per service and
// sandbox (nexus.audit.<service>.<sandbox>): a sandbox writing more evicts only its own oldest
// events, never another's (docs/audit.md).
const AuditPerSubject = 10000

// EnsureJetStream creates (or updates) every bucket and stream nexus uses, with at least
// replicas copies (1 on a single host; ClusterReplicas on three cluster nodes or more). One that
// exists with more replicas keeps them: a node never scales the cluster's store down, and one
// created R1 on a single host is raised in place (JetStream copies it to the new peers). Only
// the bus user may do this; services bind to what exists.
func EnsureJetStream(ctx context.Context, nc *nats.Conn, replicas int) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	keep := func(stream string) int {
		if st, err := js.Stream(ctx, stream); err == nil && st.CachedInfo().Config.Replicas > replicas {
			return st.CachedInfo().Config.Replicas
		}
		return max(replicas, 1)
	}
	buckets, streams := storeConfig()
	for _, b := range buckets {
		b.Replicas = keep("KV_" + b.Bucket)
		if _, err := js.CreateOrUpdateKeyValue(ctx, b); err != nil {
			return fmt.Errorf("jetstream: bucket %s: %w", b.Bucket, err)
		}
	}
	for _, s := range streams {
		s.Replicas = keep(s.Name)
		if _, err := js.CreateOrUpdateStream(ctx, s); err != nil {
			return fmt.Errorf("jetstream: stream %s: %w", s.Name, err)
		}
	}
	return nil
}

// storeConfig is every bucket and stream nexus uses, their replica counts left unset.
func storeConfig() ([]jetstream.KeyValueConfig, []jetstream.StreamConfig) {
	buckets := []jetstream.KeyValueConfig{
		{Bucket: KVSandboxes, Description: "sandbox registry", History: 5, Storage: jetstream.FileStorage},
		{Bucket: KVPorts, Description: "port forwards", History: 1, Storage: jetstream.FileStorage},
		{Bucket: KVSnapshots, Description: "snapshots", History: 1, Storage: jetstream.FileStorage},
		{Bucket: KVHosts, Description: "host heartbeats and drains", History: 1, Storage: jetstream.FileStorage},
		{Bucket: KVLeases, Description: "caller leases of ephemeral sandboxes", History: 1, TTL: LeaseTTL, Storage: jetstream.FileStorage},
	}
	streams := []jetstream.StreamConfig{
		{
			Name: StreamAudit, Description: "every egress decision", Subjects: []string{AuditPrefix + ".>"},
			Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
			MaxAge: 30 * 24 * time.Hour, MaxBytes: 1 << 30, Duplicates: 2 * time.Minute,
			// Updated in place on an existing home: the old nexus.audit.egress.<sandbox>
			// events stay under the same subjects, now with the per-subject limit.
			MaxMsgsPerSubject: AuditPerSubject,
		},
		{
			Name: StreamEvents, Description: "lifecycle, listener and port events", Subjects: []string{EventsPrefix + ".>"},
			Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
			MaxAge: 7 * 24 * time.Hour, MaxBytes: 256 << 20,
		},
	}
	return buckets, streams
}

// StoreReady reports whether every bucket and stream of EnsureJetStream exists and answers: on
// a cluster node, once a quorum of nodes is up and the meta leader has set the store up.
func StoreReady(ctx context.Context, nc *nats.Conn) error { return storeServes(ctx, nc, storeNames()) }

// storeNames are the JetStream streams of every bucket and stream nexus uses.
func storeNames() []string {
	buckets, streams := storeConfig()
	names := make([]string, 0, len(buckets)+len(streams))
	for _, b := range buckets {
		names = append(names, "KV_"+b.Bucket)
	}
	for _, st := range streams {
		names = append(names, st.Name)
	}
	return names
}

// storeNamesOf are the streams of storeNames that user may look up (its permissions allow
// their STREAM.INFO): those it opens as it starts.
func storeNamesOf(user string) []string {
	perm := permissions(user, LocalHost)
	if perm == nil {
		return storeNames() // admin: everything
	}
	var out []string
	for _, n := range storeNames() {
		if slices.Contains(perm.Publish.Allow, "$JS.API.STREAM.INFO."+n) {
			out = append(out, n)
		}
	}
	return out
}

// storeServes reports whether each of the streams names exists and answers.
func storeServes(ctx context.Context, nc *nats.Conn, names []string) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	for _, n := range names {
		if _, err := js.Stream(ctx, n); err != nil {
			return fmt.Errorf("jetstream: %s: %w", n, err)
		}
	}
	return nil
}

// KV binds to one of nexus's buckets, which the bus created.
func KV(ctx context.Context, nc *nats.Conn, bucket string) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("jetstream: bucket %s does not exist: is the bus from this nexus version?", bucket)
		}
		return nil, fmt.Errorf("jetstream: bucket %s: %w", bucket, err)
	}
	return kv, nil
}
