package netstack_test

import (
	"io"
	"os"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestMain silences gvisor-tap-vsock's package-global logrus logger, which reports every guest
// disconnect at error level.
func TestMain(m *testing.M) {
	logrus.SetOutput(io.Discard)
	os.Exit(m.Run())
}
