// Package image_test pulls and imports OCI images through a whole nexus stack (`nexus up` in a
// temp home) from a registry the test runs on loopback, and boots one as a sandbox.
package image_test

import (
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
)

var stack *testutil.Stack

func TestMain(m *testing.M) { testutil.Main(m, &stack) }
