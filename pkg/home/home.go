// Package home resolves the on-disk layout under $NEXUS_HOME (DESIGN §8).
//
// Every process derives its paths from one Dir so tests can point a whole stack at a temp dir by
// setting NEXUS_HOME (and HOME) and nothing else.
package home

import (
	"fmt"
	"os"
	"path/filepath"
)

// Dir is the root of nexus state on this machine. Where it is comes from the settings table
// (--home, $NEXUS_HOME, default ~/.local/share/nexus); this package only lays it out.
type Dir string

func (d Dir) String() string { return string(d) }

// Bus holds the JetStream store and the bus credentials.
func (d Dir) Bus() string { return filepath.Join(string(d), "bus") }

// BusCreds holds one credentials file per bus user, mode 0600.
func (d Dir) BusCreds() string { return filepath.Join(string(d), "bus", "creds") }

// Cache is the default download cache (kernel debs, unpacked kernels, built initramfs, images'
// inputs); --cache ($NEXUS_CACHE) puts it elsewhere so that many homes share one.
func (d Dir) Cache() string { return filepath.Join(string(d), "cache") }

// Images holds built root images (ext4).
func (d Dir) Images() string { return filepath.Join(string(d), "images") }

// Sandboxes holds one directory per sandbox: overlay, sockets, console log.
func (d Dir) Sandboxes() string { return filepath.Join(string(d), "sandboxes") }

// Sandbox is the directory of one sandbox by its id.
func (d Dir) Sandbox(id string) string { return filepath.Join(string(d), "sandboxes", id) }

// Snapshots holds snapshot RAM files, device state and disk overlays.
func (d Dir) Snapshots() string { return filepath.Join(string(d), "snapshots") }

// Templates holds the booted templates warm creates restore (one directory per key).
func (d Dir) Templates() string { return filepath.Join(string(d), "templates") }

// Volumes holds named volume images.
func (d Dir) Volumes() string { return filepath.Join(string(d), "volumes") }

// Networks holds the netstack's network specs, one <sandbox id>.json each (0600: they hold the
// sandbox's proxy token), so a restarted netstack brings its networks back.
func (d Dir) Networks() string { return filepath.Join(string(d), "netstack") }

// CA holds the MITM certificate authority.
func (d Dir) CA() string { return filepath.Join(string(d), "ca") }

// MITMSandboxes holds the mitm's sandbox records (pkg/records: one <sandbox id>.json each, token
// and placeholder hashes only, never a secret).
func (d Dir) MITMSandboxes() string { return filepath.Join(string(d), "mitm") }

// Secrets holds the encrypted secret store and its key.
func (d Dir) Secrets() string { return filepath.Join(string(d), "secrets") }

// AuditSpool is a service's audit write-ahead file (audit.NewSpooledPublisher).
func (d Dir) AuditSpool(service string) string {
	return filepath.Join(string(d), "audit", service+".spool")
}

// Delegations holds the gateway's worktree delegations: one record <name>.json each, with the
// delegation's working files (the guest's git view, its branch ref) in <name>/ beside it.
func (d Dir) Delegations() string { return filepath.Join(string(d), "delegations") }

// Worktrees holds the git worktrees of delegations, one <name>/ each, mounted into sandboxes.
func (d Dir) Worktrees() string { return filepath.Join(string(d), "worktrees") }

// Run holds pid and lock files of running nexus processes.
func (d Dir) Run() string { return filepath.Join(string(d), "run") }

// Ensure creates the root and checks that it is writable, with one clear error if not.
func (d Dir) Ensure() error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return fmt.Errorf("nexus home %s is not usable: %w", d, err)
	}
	f, err := os.CreateTemp(string(d), ".probe-*")
	if err != nil {
		return fmt.Errorf("nexus home %s is not writable: %w", d, err)
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	return nil
}
