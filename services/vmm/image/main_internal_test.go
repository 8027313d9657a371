package image

import (
	"os"
	"testing"
)

// TestMain lets the test binary be the extractor child, as the nexus binary is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ExtractCommand {
		os.Exit(ExtractMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}
