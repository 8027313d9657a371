// Package launch_test checks `nexus agent launch` (and its alias `nexus herdr launch`) end to
// end against a whole nexus stack booting real QEMU microVMs: exit statuses, the sandbox
// removed whatever happens, no NIC without --agent-egress, the caller's lease (kill -9 of the
// launching CLI tears the sandbox down), refusals, and the real claude on nexus-agent-base.
package launch_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/IniZio/nexus/pkg/testutil"
)

var stack *testutil.Stack

func TestMain(m *testing.M) {
	if err := testutil.QEMUAvailable(); err != nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "CI needs QEMU:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "skipping VM tests:", err)
		os.Exit(0)
	}
	var err error
	stack, err = testutil.StartStack()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "---- nexus up log (tail) ----")
		log := stack.Log()
		if len(log) > 20000 {
			log = log[len(log)-20000:]
		}
		fmt.Fprintln(os.Stderr, log)
	}
	stack.Stop()
	os.Exit(code)
}
