package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestClusterMigrateCommand: `nexus cluster migrate --from DIR --host b` on the control host
// copies the store a worker set aside (its sandbox record now on host b, its audit events), says
// so in its JSON, and refuses a second run; on a worker host it is refused with the reason.
func TestClusterMigrateCommand(t *testing.T) {
	c := testutil.NewBusCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A worker's single-host store, as `nexus cluster join` left it aside and the operator
	// copied it to the control host.
	old, err := testutil.StartBus(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	admin := old.Connect(t, bus.UserAdmin)
	kv, err := bus.KV(ctx, admin, bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "default/w", []byte(`{"id":"sbw","name":"default/w","host":"local"}`)); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(admin)
	for range 3 {
		if _, err := js.Publish(ctx, bus.AuditPrefix+".egress.sbw", []byte(`{"sandbox":"sbw"}`)); err != nil {
			t.Fatal(err)
		}
	}
	admin.Close()
	old.Server.Shutdown()
	from := filepath.Join(string(old.Home), "bus", "jetstream")

	run := func(node *testutil.Bus, args ...string) (string, string, int) {
		root := NewRoot()
		var out, errOut bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(append([]string{"--home", string(node.Home), "--bus-url", node.URL, "--log-level", "error"}, args...))
		code := Execute(root)
		return out.String(), errOut.String(), code
	}
	if _, errOut, code := run(c.Nodes[1], "cluster", "migrate", "--from", from); code == 0 || !strings.Contains(errOut, "is a worker") {
		t.Fatalf("on the worker: exit %d, %q; want refused as a worker", code, errOut)
	}
	out, errOut, code := run(c.Nodes[0], "cluster", "migrate", "--from", from, "--host", "b", "--json")
	var st bus.MigrateStats
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Records != 1 || st.Audit != 3 {
		t.Fatalf("nexus cluster migrate: exit %d, %q %q; want 1 record and 3 audit events", code, out, errOut)
	}
	nc := c.Nodes[0].Connect(t, bus.UserAdmin)
	ckv, err := bus.KV(ctx, nc, bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	e, err := ckv.Get(ctx, "default/w")
	if err != nil || !strings.Contains(string(e.Value()), `"host":"b"`) {
		t.Fatalf("the worker's record in the cluster: %v, want it on host b", err)
	}
	if _, errOut, code := run(c.Nodes[0], "cluster", "migrate", "--from", from); code == 0 || !strings.Contains(errOut, "migrated already") {
		t.Fatalf("a second run: exit %d, %q; want refused as done", code, errOut)
	}
}
