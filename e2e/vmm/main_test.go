// Package vmm_test boots real QEMU microVMs through a whole nexus stack (`nexus up` in a temp
// home) and checks what a user of the lifecycle CLI sees.
package vmm_test

import (
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

var stack *testutil.Stack

func TestMain(m *testing.M) { testutil.Main(m, &stack, testutil.Warm()) }
