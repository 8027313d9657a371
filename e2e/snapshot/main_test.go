// Package snapshot_test snapshots and forks real QEMU microVMs through a whole nexus stack (`nexus up`
// in a temp home): counters that keep counting in forks, isolation, refusals and named volumes.
package snapshot_test

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
