// Package bench measures nexus against baselines in one run (make bench): boot, exec round
// trip, idle memory, parallel creates and keystroke echo. Goals are ratios and percentiles
// reported as benchmark metrics, never asserted: these machines are shared and noisy.
package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
)

var (
	stack  *testutil.Stack
	client *api.Client
	// apiURL and apiToken reach the stack's HTTP API (api_bench_test.go).
	apiURL, apiToken string
)

func TestMain(m *testing.M) {
	testutil.Main(m, &stack,
		testutil.Setup(func(f *testutil.Fixture) error {
			f.WarmCreate() // the product's default; the cold rows ask for Cold
			resolve, err := startNetServer()
			f.Flags(resolve)
			if err != nil {
				return err
			}
			port, err := testutil.BusPort()
			apiURL = fmt.Sprintf("http://127.0.0.1:%d", port)
			f.Flags(fmt.Sprintf("--api=127.0.0.1:%d", port))
			return err
		}),
		testutil.Started(func(s *testutil.Stack) error {
			nc, err := s.Connect(bus.UserCLI)
			if err != nil {
				return err
			}
			client = api.NewClient(nc)
			out, err := s.Command("token", "create", "bench", "--scope", "write").Output()
			apiToken = strings.TrimSpace(string(out))
			return err
		}))
}

// sandbox creates a nexus-mini sandbox for b and removes it afterwards.
func sandbox(b *testing.B, name string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := client.Create(ctx, api.CreateRequest{Name: name, Image: "nexus-mini", MemoryMiB: 256, Labels: map[string]string{"nexus-test": "1"}}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { remove(name) })
}

func remove(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client.Apply(ctx, api.Remove, api.NamesRequest{Names: []string{name}, Force: true})
}

func exec(ctx context.Context, name string, argv ...string) error {
	exit, err := client.Run(ctx, api.ExecRequest{Name: name, Argv: argv}, api.IO{})
	if err != nil {
		return err
	}
	if exit.Code != 0 {
		return fmt.Errorf("%v: exit %d %s", argv, exit.Code, exit.Error)
	}
	return nil
}

// percentile of sorted durations, in milliseconds.
func percentile(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p * float64(len(s)-1))
	return float64(s[i].Microseconds()) / 1000
}
