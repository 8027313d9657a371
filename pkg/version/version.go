// Package version is the build's version, set with -ldflags at link time.
package version

// Version is a SemVer string (the micro framework requires one).
var Version = "0.1.0"

// Commit is the git commit the binary was built from, when known.
var Commit = "dev"
