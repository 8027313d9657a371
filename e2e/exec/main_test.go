// Package exec_test runs `nexus exec` against a real guest with readers and writers that stall
// longer than the stream's peer-gone timeout, callers that vanish, and the statuses nexus
// returns for its own failures (issue 18). The stack runs with --stream-peer-gone shortened to
// peerGone, so a stall of a few seconds proves what a stall of minutes would.
package exec_test

import (
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

var stack *testutil.Stack

// peerGone is the stack's (and its CLI's) stream peer-gone timeout.
const peerGone = 3 * time.Second

func TestMain(m *testing.M) {
	testutil.Main(m, &stack, testutil.Warm(), testutil.Setup(func(f *testutil.Fixture) error {
		f.Env("NEXUS_STREAM_PEER_GONE=" + peerGone.String())
		return nil
	}))
}
