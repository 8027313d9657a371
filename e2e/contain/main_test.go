// Package contain_test checks that one runaway sandbox stays its own problem (issue 19): a guest
// that fills the host disk, burns CPU, forks without end or writes without end leaves its
// neighbours working, and QEMU runs contained (unprivileged, seccomp, private root, own cgroup).
//
// The stack's $NEXUS_HOME is a small loop-mounted ext4, so "the host disk" can be filled for real.
package contain_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/home"
)

var stack *testutil.Stack

// tmpHome is the stack's $NEXUS_HOME: an ext4 of homeSize.
var tmpHome string

const (
	homeSize = "1G" // free space for a sandbox's whole root disk (diskMiB), which creates check
	minFree  = "64MiB"
	diskMiB  = "600"
)

func TestMain(m *testing.M) {
	testutil.Main(m, &stack, testutil.Warm(),
		testutil.Setup(func(f *testutil.Fixture) error {
			if os.Geteuid() != 0 {
				return fmt.Errorf("the contain tests mount a loop device as the home: run them as root")
			}
			tmpHome = filepath.Join(f.Dir, "home")
			if err := os.MkdirAll(tmpHome, 0o700); err != nil {
				return err
			}
			// A loop-mounted ext4, not a tmpfs: tmpfs pages are memory, charged to the QEMU that
			// writes them, so a tmpfs home fills the writer's memory cgroup before it fills.
			img := filepath.Join(f.Dir, "home.img")
			for _, c := range [][]string{{"truncate", "-s", homeSize, img}, {"mkfs.ext4", "-q", "-m", "0", img},
				{"mount", "-o", "loop", img, tmpHome}, {"chmod", "0700", tmpHome}} {
				if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
					return fmt.Errorf("%s: %v: %s", c[0], err, out)
				}
			}
			f.Cleanup(func() { exec.Command("umount", "-l", tmpHome).Run() })
			f.Env("NEXUS_HOME="+tmpHome, "NEXUS_MIN_FREE_DISK="+minFree)
			return nil
		}),
		testutil.Started(func(s *testutil.Stack) error {
			s.Home = home.Dir(tmpHome) // the environment's NEXUS_HOME wins over the stack's own
			return nil
		}))
}
