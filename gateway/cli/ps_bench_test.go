package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
)

// BenchmarkPS10000 is what a user waits for when they run `nexus ps -a` (the table) and
// `nexus ps -a --json` against a registry of 10,000 sandboxes: the CLI's bus connection, the
// gateway's listing page by page, the vmm's columns (one call per host) and the formatting, as
// Execute runs them. The records are in the bucket before the gateway starts, as an earlier
// gateway left them; none of them runs, so nothing changes them while the benchmark runs.
func BenchmarkPS10000(b *testing.B) {
	const n = 10000
	st := newGatewayStackWith(b, func(tb *testutil.Bus) { seedSandboxes(b, tb, n) })
	for _, c := range []struct {
		name string
		args []string
		rows func(out string) int
	}{
		{"table", []string{"ps", "-a"}, func(out string) int { return strings.Count(out, "\n") - 1 }},
		{"json", []string{"ps", "-a", "--json"}, func(out string) int { return strings.Count(out, "\n  {\n") }},
	} {
		b.Run(c.name, func(b *testing.B) {
			// The gateway's cache of the registry is loaded once every record is listed.
			testutil.WaitFor(b, time.Minute, func() error {
				if got := c.rows(st.must(b, c.args...)); got != n {
					return fmt.Errorf("nexus %s listed %d of %d sandboxes", strings.Join(c.args, " "), got, n)
				}
				return nil
			})
			b.ResetTimer()
			for range b.N {
				if got := c.rows(st.must(b, c.args...)); got != n {
					b.Fatalf("nexus %s listed %d of %d sandboxes", strings.Join(c.args, " "), got, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/ps")
		})
	}
}

// seedSandboxes writes n synthetic records straight into the registry's bucket: created,
// stopped and failed ones (no VM expected), with labels, an egress list and some with a TTL.
func seedSandboxes(t testing.TB, tb *testutil.Bus, n int) {
	t.Helper()
	ctx := context.Background()
	kv, err := bus.KV(ctx, tb.Connect(t, bus.UserGateway), bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			sb := api.Sandbox{ID: fmt.Sprintf("sb-%012d", i), Name: fmt.Sprintf("bench/sb-%05d", i), Image: "nexus-mini", Host: bus.LocalHost,
				Agent: "claude-code", MemoryMiB: 256, VCPUs: 1, State: api.StateCreated,
				Labels:    map[string]string{"team": fmt.Sprint(i % 7), "task": fmt.Sprint(i)},
				Egress:    api.Egress{Mode: api.EgressCurated, Allow: []string{"api.anthropic.com", "registry.npmjs.org", "pypi.org"}},
				CreatedAt: now.Add(-time.Duration(i) * time.Minute), UpdatedAt: now}
			switch i % 10 {
			case 3:
				sb.State = api.StateStopped
			case 7:
				sb.State, sb.Reason = api.StateFailed, "the VM exited on its own"
			case 9:
				sb.ExpiresAt = sb.CreatedAt.Add(7 * 24 * time.Hour)
			}
			data, err := json.Marshal(sb)
			if err != nil {
				return err
			}
			_, err = kv.Put(ctx, sb.Name, data)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}
