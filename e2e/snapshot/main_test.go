// Package snapshot_test snapshots and forks real QEMU microVMs through a whole nexus stack (`nexus up`
// in a temp home): counters that keep counting in forks, isolation, refusals and named volumes.
package snapshot_test

import (
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

var stack *testutil.Stack

func TestMain(m *testing.M) { testutil.Main(m, &stack) }
