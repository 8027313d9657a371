package bus_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// migrateAudit is how many audit events the single host wrote: more than one progress batch.
const migrateAudit = 600

// TestClusterInitMigratesTheSingleHostStore: a home with sandbox records, a snapshot, its host
// heartbeat, audit events and lifecycle events becomes the first node of a cluster; once a
// second node gives the cluster a quorum, WaitStore (what `nexus up` runs before the services)
// has copied the records (their host renamed from "local" to the node's), not the heartbeat,
// and every audit and lifecycle event in order with its content and headers. The store set
// aside is unchanged; a second run is refused, and a run that redoes everything after a crash
// (its progress lost) adds nothing and resurrects no record removed since.
func TestClusterInitMigratesTheSingleHostStore(t *testing.T) {
	if testing.Short() {
		t.Skip("two bus nodes")
	}
	testutil.IsolateHome(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ha, hb := home.Dir(t.TempDir()), home.Dir(t.TempDir())

	// The single host's store.
	single, err := bus.StartServer(ctx, bus.ServerConfig{Home: ha, Port: -1, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := bus.Connect(ctx, bus.ConnectConfig{Home: ha, User: bus.UserAdmin, URL: single.URL()})
	if err != nil {
		t.Fatal(err)
	}
	put := func(bucket, key, value string) {
		t.Helper()
		kv, err := bus.KV(ctx, admin, bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	put(bus.KVSandboxes, "default/web", `{"id":"sb1","name":"default/web","state":"running","host":"local","extra":{"kept":true}}`)
	put(bus.KVSandboxes, "default/db", `{"id":"sb2","name":"default/db","state":"stopped","host":"local"}`)
	put(bus.KVSandboxes, "default/gone", `{"id":"sb3","name":"default/gone","host":"local"}`)
	kvs, _ := bus.KV(ctx, admin, bus.KVSandboxes)
	if err := kvs.Delete(ctx, "default/gone"); err != nil {
		t.Fatal(err)
	}
	put(bus.KVSnapshots, "snap1", `{"name":"snap1","sandbox":"default/web","host":"local"}`)
	put(bus.KVHosts, bus.LocalHost, `{"host":"local"}`)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	var audit, events []string
	for i := range migrateAudit {
		m := &nats.Msg{Subject: fmt.Sprintf("%s.egress.sb%d", bus.AuditPrefix, i%3+1), Data: fmt.Appendf(nil, `{"n":%d}`, i), Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, "id-"+strconv.Itoa(i))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		audit = append(audit, string(m.Data))
	}
	for i := range 5 {
		data := fmt.Sprintf(`{"type":"state","id":"sb1","to":"s%d"}`, i)
		if _, err := js.Publish(ctx, "nexus.events.sandbox.sb1", []byte(data)); err != nil {
			t.Fatal(err)
		}
		events = append(events, data)
	}
	admin.Close()
	single.Shutdown()

	if _, err := bus.Init(bus.InitConfig{Home: ha, Name: "t", Host: "a", Advertise: "127.0.0.1", Listen: "127.0.0.1",
		ClientPort: freePort(t), RoutePort: freePort(t)}); err != nil {
		t.Fatal(err)
	}
	aside := bus.SingleHostStore(ha)
	before := treeSum(t, aside)
	a := startNode(t, ha)
	defer a.Shutdown()
	if !bus.MigrationPending(ha) {
		t.Fatal("after init the single-host store is not pending migration")
	}
	clA, _, _ := bus.LoadCluster(ha)
	_, token, err := bus.CreateToken(ha, []string{clA.ClientURL()}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "the join of b", func() bool {
		_, err := bus.Join(ctx, bus.JoinConfig{Home: hb, Token: token, Host: "b", Advertise: "127.0.0.1", Listen: "127.0.0.1",
			ClientPort: freePort(t), RoutePort: freePort(t)})
		return err == nil
	})
	b := startNode(t, hb)
	defer b.Shutdown()
	if err := a.WaitStore(ctx); err != nil {
		t.Fatalf("WaitStore with two nodes: %v", err)
	}
	st, done := bus.Migrated(aside)
	if !done || st.Records != 3 || st.Audit != migrateAudit || st.Events != len(events) {
		t.Fatalf("marker %v: %+v, want 3 records (2 sandboxes, 1 snapshot), %d audit events, %d lifecycle events", done, st, migrateAudit, len(events))
	}
	if bus.MigrationPending(ha) {
		t.Fatal("still pending after the migration")
	}

	nc, err := bus.Connect(ctx, bus.ConnectConfig{Home: ha, User: bus.UserAdmin, URL: a.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	get := func(bucket, key string) map[string]any {
		t.Helper()
		kv, err := bus.KV(ctx, nc, bucket)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		return rec
	}
	web := get(bus.KVSandboxes, "default/web")
	if web == nil || web["host"] != "a" || web["state"] != "running" || web["extra"] == nil {
		t.Fatalf("default/web in the cluster: %v, want it on host a with all its fields", web)
	}
	if db := get(bus.KVSandboxes, "default/db"); db == nil || db["host"] != "a" {
		t.Fatalf("default/db in the cluster: %v", db)
	}
	if gone := get(bus.KVSandboxes, "default/gone"); gone != nil {
		t.Fatalf("a record removed on the single host came back: %v", gone)
	}
	if s := get(bus.KVSnapshots, "snap1"); s == nil || s["host"] != "a" {
		t.Fatalf("snapshot snap1 in the cluster: %v", s)
	}
	if h := get(bus.KVHosts, bus.LocalHost); h != nil {
		t.Fatalf("the single host's heartbeat came along: %v", h)
	}
	gotAudit := readStream(t, ctx, nc, bus.StreamAudit)
	if len(gotAudit) != migrateAudit {
		t.Fatalf("%d audit events in the cluster, want %d", len(gotAudit), migrateAudit)
	}
	for i, m := range gotAudit {
		if string(m.Data()) != audit[i] || m.Headers().Get(jetstream.MsgIDHeader) != "id-"+strconv.Itoa(i) ||
			m.Subject() != fmt.Sprintf("%s.egress.sb%d", bus.AuditPrefix, i%3+1) || m.Headers().Get(bus.MigratedSeqHeader) != strconv.Itoa(i+1) {
			t.Fatalf("audit event %d in the cluster: %s %s %v, want %s as the single host stored it", i, m.Subject(), m.Data(), m.Headers(), audit[i])
		}
	}
	gotEvents := readStream(t, ctx, nc, bus.StreamEvents)
	if len(gotEvents) != len(events) {
		t.Fatalf("%d lifecycle events in the cluster, want %d", len(gotEvents), len(events))
	}
	for i, m := range gotEvents {
		if string(m.Data()) != events[i] {
			t.Fatalf("lifecycle event %d: %s, want %s", i, m.Data(), events[i])
		}
	}
	if after := treeSum(t, aside); after != before {
		t.Fatal("the migration changed the store set aside")
	}

	// Once migrated, it is refused.
	_, err = bus.Migrate(ctx, bus.MigrateConfig{From: aside, To: nc, Host: "a", Log: zerolog.Nop()})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a second migration: %v, want refused as done already", err)
	}

	// A crash after everything was copied but before anything was recorded: the next run
	// redoes it all and adds nothing, and a record removed in the cluster since stays removed.
	kv, _ := bus.KV(ctx, nc, bus.KVSandboxes)
	if err := kv.Delete(ctx, "default/db"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(bus.MigratedMarker(aside)); err != nil {
		t.Fatal(err)
	}
	// The progress a run saves before its first copy: the streams' last sequences were 0.
	if err := os.WriteFile(aside+".migrating", []byte(`{"stats":{"from":"x"},"streams":{"NEXUS_AUDIT":{"src":0,"dst":0},"NEXUS_EVENTS":{"src":0,"dst":0}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := bus.Migrate(ctx, bus.MigrateConfig{From: aside, To: nc, Host: "a", Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if again.Records != 0 || again.Existing != 3 {
		t.Fatalf("the redone run: %+v, want no record created and 3 found existing", again)
	}
	if n := len(readStream(t, ctx, nc, bus.StreamAudit)); n != migrateAudit {
		t.Fatalf("%d audit events after the redone run, want still %d", n, migrateAudit)
	}
	if n := len(readStream(t, ctx, nc, bus.StreamEvents)); n != len(events) {
		t.Fatalf("%d lifecycle events after the redone run, want still %d", n, len(events))
	}
	if db := get(bus.KVSandboxes, "default/db"); db != nil {
		t.Fatalf("the redone run brought back a record removed in the cluster: %v", db)
	}
}

// readStream is every message of stream name, in order.
func readStream(t *testing.T, ctx context.Context, nc *nats.Conn, name string) []jetstream.Msg {
	t.Helper()
	js, _ := jetstream.New(nc)
	cons, err := js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	if info.NumPending == 0 {
		return nil
	}
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	for range info.NumPending {
		m, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// treeSum is a digest of the names and contents of the files under dir.
func treeSum(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestServicesWaitForTheMigration: on a home whose single-host store `nexus cluster init` set
// aside, a service run on its own waits for its bus to write the migration's marker.
func TestServicesWaitForTheMigration(t *testing.T) {
	h := home.Dir(testutil.IsolateHome(t))
	if err := bus.WaitMigrated(context.Background(), h, zerolog.Nop()); err != nil {
		t.Fatalf("a home with nothing to migrate: %v", err)
	}
	if err := os.MkdirAll(bus.SingleHostStore(h), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := bus.WaitMigrated(ctx, h, zerolog.Nop()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with the store not migrated yet: %v, want still waiting at the deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- bus.WaitMigrated(context.Background(), h, zerolog.Nop()) }()
	if err := os.WriteFile(bus.MigratedMarker(bus.SingleHostStore(h)), []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("after the marker: %v", err)
	}
}
