// Package home resolves the on-disk layout under $NEXUS_HOME (DESIGN §8).
//
// Every process derives its paths from one Dir so tests can point a whole stack at a temp dir by
// setting NEXUS_HOME (and HOME) and nothing else.
package home

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Env is the environment variable that overrides the default location.
const Env = "NEXUS_HOME"

// Dir is the root of nexus state on this machine.
type Dir string

// Default returns $NEXUS_HOME, or ~/.local/share/nexus when it is unset.
func Default() (Dir, error) {
	if v := os.Getenv(Env); v != "" {
		abs, err := filepath.Abs(v)
		if err != nil {
			return "", fmt.Errorf("nexus home: %w", err)
		}
		return Dir(abs), nil
	}
	h, err := os.UserHomeDir()
	if err != nil || h == "" {
		return "", errors.New("nexus home: neither NEXUS_HOME nor HOME is set")
	}
	return Dir(filepath.Join(h, ".local", "share", "nexus")), nil
}

func (d Dir) String() string { return string(d) }

// Bus holds the JetStream store and the bus credentials.
func (d Dir) Bus() string { return filepath.Join(string(d), "bus") }

// BusCreds holds one credentials file per bus user, mode 0600.
func (d Dir) BusCreds() string { return filepath.Join(string(d), "bus", "creds") }

// CacheEnv overrides where downloads are cached, so that many homes (tests, CI) share one.
const CacheEnv = "NEXUS_CACHE"

// Cache holds downloads: kernel debs, unpacked kernels, built initramfs. $NEXUS_CACHE wins.
func (d Dir) Cache() string {
	if v := os.Getenv(CacheEnv); v != "" {
		return v
	}
	return filepath.Join(string(d), "cache")
}

// Images holds built root images (ext4).
func (d Dir) Images() string { return filepath.Join(string(d), "images") }

// Sandboxes holds one directory per sandbox: overlay, sockets, console log.
func (d Dir) Sandboxes() string { return filepath.Join(string(d), "sandboxes") }

// Sandbox is the directory of one sandbox by its id.
func (d Dir) Sandbox(id string) string { return filepath.Join(string(d), "sandboxes", id) }

// Snapshots holds snapshot RAM files, device state and disk overlays.
func (d Dir) Snapshots() string { return filepath.Join(string(d), "snapshots") }

// Volumes holds named volume images.
func (d Dir) Volumes() string { return filepath.Join(string(d), "volumes") }

// CA holds the MITM certificate authority.
func (d Dir) CA() string { return filepath.Join(string(d), "ca") }

// Secrets holds the encrypted secret store and its key.
func (d Dir) Secrets() string { return filepath.Join(string(d), "secrets") }

// AuditSpool is a service's audit write-ahead file (audit.NewSpooledPublisher).
func (d Dir) AuditSpool(service string) string {
	return filepath.Join(string(d), "audit", service+".spool")
}

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
