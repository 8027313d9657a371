// Package failpoint names the points where the crash tests kill nexus: each step of every
// lifecycle operation calls Hit with its name ("gateway/create/recorded", "vmm/start/qemu").
//
// Only a binary built with the build tag nexus_failpoints (the e2e build: make build-e2e) acts
// on them: there, Hit kills the whole process with SIGKILL, like kill -9, when the file
// $NEXUS_HOME/run/failpoint names that point (the file is removed first, so the point fires
// once). In every other build Hit does nothing and the binary holds no trace of the mechanism;
// a test checks the binary `make build` produces.
package failpoint

import "github.com/IniZio/nexus/pkg/home"

// File is the name, under home.Dir.Run, of the file that arms one point.
const File = "failpoint"

// Arm tells Hit which home's file to read; the composition root calls it once at start.
func Arm(h home.Dir) { arm(h) }

// Hit is a named point of a lifecycle operation.
func Hit(name string) { hit(name) }
