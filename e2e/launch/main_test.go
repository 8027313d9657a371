// Package launch_test checks `nexus agent launch` (and its alias `nexus herdr launch`) end to
// end against a whole nexus stack booting real QEMU microVMs: exit statuses, the sandbox
// removed whatever happens, no NIC without --agent-egress, the caller's lease (kill -9 of the
// launching CLI tears the sandbox down), refusals, and the real claude on nexus-agent-base.
package launch_test

import (
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

var stack *testutil.Stack

// Cold: its launches come in several shapes (with and without egress, nexus-agent-base at 2 GiB),
// so templates cost more to build than their restores save (204 s warm against 99 s cold in CI).
func TestMain(m *testing.M) { testutil.Main(m, &stack) }
