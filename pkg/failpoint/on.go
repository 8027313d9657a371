//go:build nexus_failpoints

package failpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/IniZio/nexus/pkg/home"
)

// Enabled says whether this binary acts on failpoints.
const Enabled = true

// Marker is in every binary that acts on failpoints (and in no other): the build check greps
// for it.
const Marker = "nexus-failpoints-armed"

var file atomic.Pointer[string]

func arm(h home.Dir) {
	p := filepath.Join(h.Run(), File)
	file.Store(&p)
}

func hit(name string) {
	p := file.Load()
	if p == nil {
		return
	}
	b, err := os.ReadFile(*p)
	if err != nil || strings.TrimSpace(string(b)) != name {
		return
	}
	os.Remove(*p)
	fmt.Fprintf(os.Stderr, "%s: %s: killing this process\n", Marker, name)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not delivered synchronously; nothing more may run
}
