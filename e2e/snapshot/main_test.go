// Package snapshot_test snapshots and forks real QEMU microVMs through a whole nexus stack (`nexus up`
// in a temp home): counters that keep counting in forks, isolation, refusals and named volumes.
package snapshot_test

import (
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

var stack *testutil.Stack

// Warm create is on here (TestWarmCreateFreshIdentity; forks and snapshots beside templates).
func TestMain(m *testing.M) {
	testutil.Main(m, &stack, testutil.Setup(func(f *testutil.Fixture) error { f.WarmCreate(); return nil }))
}
