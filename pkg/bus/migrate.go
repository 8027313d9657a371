package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// A home that ran the single-host bus keeps its store aside when it becomes a cluster node
// (moveStoreAside). Migrate copies such a store into the cluster's, once: the records of the
// buckets that describe what this host holds, and the audit and event streams in order. The
// store aside is only read (from a copy), never changed: it stays the user's backup.

// Headers every message a migration copies into a stream carries: which store it came from,
// its sequence there and its time there (the copy's stream time is when it was copied).
const (
	MigratedFromHeader = "Nexus-Migrated-From"
	MigratedSeqHeader  = "Nexus-Migrated-Seq"
	MigratedTimeHeader = "Nexus-Migrated-Time"
)

// migratedBuckets are the buckets whose records come along, their host "local" renamed to the
// cluster's name of this host. nexus_hosts (this host's heartbeat and drain under "local") and
// nexus_leases (live for seconds) do not: they are about the single host's bus, not its sandboxes.
var migratedBuckets = []string{KVSandboxes, KVSnapshots, KVPorts}

// migratedStreams are the streams copied, message by message in their order.
var migratedStreams = []string{StreamAudit, StreamEvents}

// progressEvery is how many stream messages are copied between two writes of the progress file.
const progressEvery = 256

// MigrateStats is what one migration copied, and what its marker file records.
type MigrateStats struct {
	From string    `json:"from"`
	Time time.Time `json:"time"`
	// Records are the bucket entries created; Existing those the cluster had already under
	// the same key (kept as they are, never overwritten).
	Records  int `json:"records"`
	Existing int `json:"existing"`
	// Audit and Events count the stream messages copied.
	Audit  int `json:"audit"`
	Events int `json:"events"`
}

// String is the line a user reads.
func (m MigrateStats) String() string {
	s := fmt.Sprintf("migrated %d records, %d audit events and %d lifecycle events from %s", m.Records, m.Audit, m.Events, m.From)
	if m.Existing > 0 {
		s += fmt.Sprintf(" (%d records the cluster had already were kept)", m.Existing)
	}
	return s
}

// MigratedMarker is the file a finished migration of the store at dir writes next to it.
func MigratedMarker(dir string) string { return dir + ".migrated" }

func progressFile(dir string) string { return dir + ".migrating" }

// Migrated reads the marker of the store at dir: ok is false when it was never migrated.
func Migrated(dir string) (MigrateStats, bool) {
	b, err := os.ReadFile(MigratedMarker(dir))
	if err != nil {
		return MigrateStats{}, false
	}
	var st MigrateStats
	json.Unmarshal(b, &st)
	return st, true
}

// MigrationPending reports whether h keeps the single-host store `nexus cluster init` moved
// aside and has not migrated it yet: its bus migrates it once the cluster's store serves, and
// the services of h wait for that.
func MigrationPending(h home.Dir) bool {
	if _, err := os.Stat(SingleHostStore(h)); err != nil {
		return false
	}
	_, done := Migrated(SingleHostStore(h))
	return !done
}

// MigrateConfig is one migration.
type MigrateConfig struct {
	// From is the store set aside: bus/jetstream.single-host or bus/jetstream.before-join.
	From string
	// To is a connection to the cluster's bus with rights on every bucket and stream (admin).
	To *nats.Conn
	// Host is this host's name in the cluster: records of host "local" are renamed to it.
	Host string
	// Scratch is where the temporary copy of From is made (its filesystem needs room for it);
	// empty: next to From.
	Scratch string
	Log     zerolog.Logger
}

// migrateProgress is what the progress file keeps between two runs of one migration.
type migrateProgress struct {
	Stats   MigrateStats               `json:"stats"`
	KVDone  bool                       `json:"kv_done"`
	Streams map[string]*streamProgress `json:"streams"`
}

// streamProgress is how far one stream is copied: its messages up to Src are in the cluster's
// stream at or before Dst.
type streamProgress struct {
	Src uint64 `json:"src"`
	Dst uint64 `json:"dst"`
}

// Migrate copies the store at cfg.From into the cluster's store once: bucket entries the
// cluster does not have (a create checked against the key's last revision, so that it never
// overwrites, even racing another host), then each stream's messages in order with their
// headers. It records its progress next to From as it goes, so that a run cut off is resumed
// by the next without copying anything twice, and writes MigratedMarker(From) at the end; a
// store migrated already is refused.
func Migrate(ctx context.Context, cfg MigrateConfig) (MigrateStats, error) {
	if st, done := Migrated(cfg.From); done {
		return st, errdefs.Conflict("%s was migrated already (%s): %s", cfg.From, st.Time.Format(time.RFC3339), MigratedMarker(cfg.From))
	}
	if _, err := os.Stat(cfg.From); err != nil {
		return MigrateStats{}, errdefs.NotFound("no store to migrate at %s", cfg.From)
	}
	// One migration of a store at a time: the bus's and `nexus cluster migrate`'s.
	lock, err := lockFile(cfg.From + ".lock")
	if err != nil {
		return MigrateStats{}, errdefs.Conflict("a migration of %s is under way already", cfg.From)
	}
	defer lock.Close()
	if st, done := Migrated(cfg.From); done { // finished while this one waited for the lock
		return st, errdefs.Conflict("%s was migrated already (%s): %s", cfg.From, st.Time.Format(time.RFC3339), MigratedMarker(cfg.From))
	}
	prog := migrateProgress{Stats: MigrateStats{From: cfg.From}, Streams: map[string]*streamProgress{}}
	if b, err := os.ReadFile(progressFile(cfg.From)); err == nil {
		if json.Unmarshal(b, &prog) != nil || prog.Streams == nil {
			return MigrateStats{}, fmt.Errorf("migrate: %s is damaged: remove it to start over (the records are created only where absent; stream messages may then be copied twice)", progressFile(cfg.From))
		}
		prog.Stats.From = cfg.From
		cfg.Log.Info().Str("from", cfg.From).Msg("migrate: resuming a migration cut off")
	}
	save := func() error {
		b, _ := json.Marshal(prog)
		return atomicfile.WriteFile(progressFile(cfg.From), b, 0o600)
	}
	src, stopSrc, err := openStoreCopy(cfg)
	if err != nil {
		return MigrateStats{}, err
	}
	defer stopSrc()
	sjs, err := jetstream.New(src)
	if err != nil {
		return MigrateStats{}, err
	}
	djs, err := jetstream.New(cfg.To)
	if err != nil {
		return MigrateStats{}, err
	}
	if !prog.KVDone {
		for _, b := range migratedBuckets {
			if err := migrateBucket(ctx, sjs, djs, b, cfg.Host, &prog.Stats); err != nil {
				return prog.Stats, err
			}
		}
		prog.KVDone = true
		if err := save(); err != nil {
			return prog.Stats, err
		}
		cfg.Log.Info().Int("records", prog.Stats.Records).Int("existing", prog.Stats.Existing).Msg("migrate: records copied")
	}
	for _, name := range migratedStreams {
		n := &prog.Stats.Audit
		if name == StreamEvents {
			n = &prog.Stats.Events
		}
		if err := migrateStream(ctx, sjs, djs, name, filepath.Base(cfg.From), prog.Streams, n, save, cfg.Log); err != nil {
			return prog.Stats, err
		}
	}
	prog.Stats.Time = time.Now().UTC()
	b, _ := json.MarshalIndent(prog.Stats, "", "  ")
	if err := atomicfile.WriteFile(MigratedMarker(cfg.From), append(b, '\n'), 0o600); err != nil {
		return prog.Stats, err
	}
	os.Remove(progressFile(cfg.From))
	return prog.Stats, nil
}

// migrateBucket creates in the cluster's bucket every entry of the store's that it lacks.
func migrateBucket(ctx context.Context, sjs, djs jetstream.JetStream, bucket, host string, st *MigrateStats) error {
	skv, err := sjs.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil // a store from before this bucket
	}
	if err != nil {
		return fmt.Errorf("migrate: the store's bucket %s: %w", bucket, err)
	}
	dkv, err := djs.KeyValue(ctx, bucket)
	if err != nil {
		return fmt.Errorf("migrate: the cluster's bucket %s: %w", bucket, err)
	}
	keys, err := skv.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("migrate: the store's bucket %s: %w", bucket, err)
	}
	defer keys.Stop()
	for key := range keys.Keys() {
		e, err := skv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("migrate: %s %s: %w", bucket, key, err)
		}
		sctx, cancel := StoreContext(ctx)
		// Revision 0: created only if the key has never been written in the cluster (a
		// record removed there since stays removed).
		_, err = dkv.Update(sctx, key, renameHost(e.Value(), host), 0)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			st.Existing++
		case err != nil:
			return fmt.Errorf("migrate: %s %s: %w", bucket, key, err)
		default:
			st.Records++
		}
	}
	return nil
}

// renameHost is a JSON record with its "host" renamed from LocalHost to host; any other value
// comes back as it is.
func renameHost(v []byte, host string) []byte {
	var rec map[string]json.RawMessage
	if host == "" || json.Unmarshal(v, &rec) != nil {
		return v
	}
	var h string
	if json.Unmarshal(rec["host"], &h) != nil || h != LocalHost {
		return v
	}
	rec["host"], _ = json.Marshal(host)
	out, err := json.Marshal(rec)
	if err != nil {
		return v
	}
	return out
}

// migrateStream copies the messages of stream name in order, from where progs says the last
// run got to. Each copy is tagged with from and its sequence in the store, so that what a run
// cut off published after its last saved progress is found in the cluster's stream and not
// copied again.
func migrateStream(ctx context.Context, sjs, djs jetstream.JetStream, name, from string, progs map[string]*streamProgress, n *int, save func() error, log zerolog.Logger) error {
	sst, err := sjs.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrate: the store's stream %s: %w", name, err)
	}
	dst, err := djs.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("migrate: the cluster's stream %s: %w", name, err)
	}
	p := progs[name]
	if p == nil {
		// Nothing of it copied yet: what the cluster's stream holds now is not ours.
		p = &streamProgress{Dst: dst.CachedInfo().State.LastSeq}
		progs[name] = p
		if err := save(); err != nil {
			return err
		}
	} else if err := findCopied(ctx, djs, name, from, p, n); err != nil {
		return err
	}
	if last := sst.CachedInfo().State.LastSeq; p.Src >= last {
		return nil
	}
	cons, err := sjs.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: p.Src + 1})
	if err != nil {
		return fmt.Errorf("migrate: reading the store's stream %s: %w", name, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("migrate: reading the store's stream %s: %w", name, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("migrate: reading the store's stream %s: %w", name, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	log.Info().Str("stream", name).Uint64("messages", info.NumPending).Msg("migrate: copying")
	for k := uint64(0); k < info.NumPending; k++ {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("migrate: reading the store's stream %s: %w", name, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("migrate: %s: %w", name, err)
		}
		out := &nats.Msg{Subject: m.Subject(), Data: m.Data(), Header: nats.Header{}}
		for k, v := range m.Headers() {
			if !strings.HasPrefix(k, "Nats-Expected-") {
				out.Header[k] = v
			}
		}
		out.Header.Set(MigratedFromHeader, from)
		out.Header.Set(MigratedSeqHeader, strconv.FormatUint(meta.Sequence.Stream, 10))
		out.Header.Set(MigratedTimeHeader, meta.Timestamp.UTC().Format(time.RFC3339Nano))
		sctx, cancel := StoreContext(ctx)
		ack, err := djs.PublishMsg(sctx, out)
		cancel()
		if err != nil {
			save()
			return fmt.Errorf("migrate: copying message %d of %s: %w", meta.Sequence.Stream, name, err)
		}
		p.Src, p.Dst = meta.Sequence.Stream, max(p.Dst, ack.Sequence)
		if !ack.Duplicate {
			*n++
		}
		if k%progressEvery == progressEvery-1 {
			if err := save(); err != nil {
				return err
			}
		}
	}
	return save()
}

// findCopied moves p past what an earlier run copied into the cluster's stream name after
// its last saved progress (tagged from), counting it in n.
func findCopied(ctx context.Context, djs jetstream.JetStream, name, from string, p *streamProgress, n *int) error {
	dst, err := djs.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("migrate: the cluster's stream %s: %w", name, err)
	}
	last := dst.CachedInfo().State.LastSeq
	if p.Dst >= last {
		return nil
	}
	cons, err := djs.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: p.Dst + 1, InactiveThreshold: oneShotInactive})
	if err != nil {
		return fmt.Errorf("migrate: reading the cluster's stream %s: %w", name, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("migrate: reading the cluster's stream %s: %w", name, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("migrate: reading the cluster's stream %s: %w", name, err)
	}
	defer it.Stop()
	for seen := uint64(0); seen < info.NumPending; seen++ {
		m, err := it.Next()
		if err != nil {
			return fmt.Errorf("migrate: reading the cluster's stream %s: %w", name, err)
		}
		if m.Headers().Get(MigratedFromHeader) != from {
			continue
		}
		seq, err := strconv.ParseUint(m.Headers().Get(MigratedSeqHeader), 10, 64)
		meta, merr := m.Metadata()
		if err != nil || merr != nil || seq <= p.Src {
			continue
		}
		p.Src, p.Dst = seq, meta.Sequence.Stream
		*n++
	}
	return nil
}

// oneShotInactive is how soon the server drops a consumer read once and left.
const oneShotInactive = 30 * time.Second

// openStoreCopy copies the store at cfg.From to a scratch directory and serves it with a
// nats-server of this process that listens nowhere: the store itself is never opened, so
// JetStream's recovery cannot change it. The returned func stops the server and removes the copy.
func openStoreCopy(cfg MigrateConfig) (*nats.Conn, func(), error) {
	scratch := cfg.Scratch
	if scratch == "" {
		scratch = filepath.Dir(cfg.From)
	}
	// A copy a run cut off left behind (this one holds the store's lock) goes first.
	pattern := ".migrate-" + filepath.Base(cfg.From) + ".tmp-"
	if old, _ := filepath.Glob(filepath.Join(scratch, pattern+"*")); len(old) > 0 {
		for _, o := range old {
			os.RemoveAll(o)
		}
	}
	tmp, err := os.MkdirTemp(scratch, pattern)
	if err != nil {
		return nil, nil, fmt.Errorf("migrate: %w", err)
	}
	cleanup := func() { os.RemoveAll(tmp) }
	// nats-server keeps its store under <StoreDir>/jetstream, which is what the bus's
	// StoreDir (bus/jetstream) names itself.
	store := filepath.Join(tmp, "jetstream")
	if err := copyTree(cfg.From, store); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("migrate: copying %s aside to read it: %w", cfg.From, err)
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: "nexus-migrate", DontListen: true, JetStream: true, StoreDir: store,
		NoSigs: true, NoLog: true, MaxPayload: 8 << 20,
		JetStreamMaxMemory: 256 << 20, JetStreamMaxStore: 8 << 30,
	})
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("migrate: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(time.Minute) {
		ns.Shutdown()
		cleanup()
		return nil, nil, fmt.Errorf("migrate: the store at %s did not open", cfg.From)
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		ns.Shutdown()
		cleanup()
		return nil, nil, fmt.Errorf("migrate: %w", err)
	}
	return nc, func() {
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		cleanup()
	}, nil
}

// copyTree copies the directories and regular files under from to to.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		target := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o700)
		case d.Type().IsRegular():
			return copyFile(path, target)
		}
		return nil
	})
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// WaitMigrated returns once h has no single-host store pending migration (MigrationPending):
// at once on a home without one. The services of `nexus serve <service>` on the node that ran
// `nexus cluster init` wait with it for their bus to bring the records along, saying every ten
// seconds what they wait for, until ctx ends.
func WaitMigrated(ctx context.Context, h home.Dir, log zerolog.Logger) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 0; MigrationPending(h); n++ {
		if n%10 == 0 {
			log.Warn().Str("from", SingleHostStore(h)).Msg("cluster: waiting for the bus to migrate the single-host store before starting")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}
