// Package credbroker holds the host's real credentials and everything that hands them out
// (DESIGN §5): the named secret store (encrypted at rest), placeholder minting for sandboxes,
// resolve for the mitm, and the CredGuardian that keeps the host's Claude Code OAuth token fresh.
//
// The guest only ever sees 64-hex placeholders. A placeholder resolves to the secret as it was
// when the placeholder was minted (a value is snapshotted; a command secret keeps the command
// it had): rotating a secret affects sandboxes minted afterwards, and a running sandbox keeps
// what it was issued at start until it is restarted, as the spec says.
package credbroker

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/IniZio/nexus/pkg/atomicfile"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Files in the store directory ($NEXUS_HOME/secrets).
const (
	KeyFile   = "key"       // 32 random bytes, mode 0600
	StoreFile = "store.enc" // nonce || AES-256-GCM(JSON state), mode 0600
	lockFile  = ".lock"
)

var storeAAD = []byte("nexus-secrets-v1")

// state is the whole store, encrypted as one JSON document.
type state struct {
	Secrets map[string]secretRecord `json:"secrets"`
	// Placeholders is keyed by the hex SHA-256 of the placeholder: the placeholder itself is
	// not kept.
	Placeholders map[string]placeholderRecord `json:"placeholders"`
}

type secretRecord struct {
	Value   string    `json:"value,omitempty"`
	Command string    `json:"command,omitempty"`
	Hosts   []string  `json:"hosts,omitempty"`
	Updated time.Time `json:"updated"`
}

type placeholderRecord struct {
	Sandbox string   `json:"sandbox"`
	Hosts   []string `json:"hosts"`
	Secret  string   `json:"secret"`
	// Value or Command: the secret as of mint time.
	Value   string    `json:"value,omitempty"`
	Command string    `json:"command,omitempty"`
	Minted  time.Time `json:"minted"`
}

func newState() *state {
	return &state{Secrets: map[string]secretRecord{}, Placeholders: map[string]placeholderRecord{}}
}

// diskStore reads and writes the encrypted state file.
type diskStore struct {
	dir  string
	aead cipher.AEAD
}

func openDiskStore(dir string) (*diskStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("secret store: %w", err)
	}
	key, err := loadOrCreateKey(dir)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secret store: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secret store: %w", err)
	}
	return &diskStore{dir: dir, aead: aead}, nil
}

// loadOrCreateKey returns the 32-byte key, generating it once under the store lock.
func loadOrCreateKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, KeyFile)
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("secret store: generate key: %w", err)
		}
		if err := atomicfile.WriteFile(path, key, 0o600); err != nil {
			return nil, fmt.Errorf("secret store: %w", err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("secret store: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secret store: %s is not a 32-byte key", path)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, fmt.Errorf("secret store: %s is readable by others: %w", path, err)
		}
	}
	return key, nil
}

// lockDir takes the store's flock; the returned func releases it.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("secret store: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("secret store: lock: %w", err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// fileID identifies one version of the store file (atomic renames change the inode).
type fileID struct {
	ino   uint64
	size  int64
	mtime time.Time
}

func (d *diskStore) stat() fileID {
	st, err := os.Stat(filepath.Join(d.dir, StoreFile))
	if err != nil {
		return fileID{}
	}
	id := fileID{size: st.Size(), mtime: st.ModTime()}
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		id.ino = s.Ino
	}
	return id
}

func (d *diskStore) load() (*state, fileID, error) {
	id := d.stat()
	b, err := os.ReadFile(filepath.Join(d.dir, StoreFile))
	if errors.Is(err, fs.ErrNotExist) {
		return newState(), id, nil
	}
	if err != nil {
		return nil, id, fmt.Errorf("secret store: %w", err)
	}
	ns := d.aead.NonceSize()
	if len(b) < ns+d.aead.Overhead() {
		return nil, id, fmt.Errorf("secret store: %s is truncated", filepath.Join(d.dir, StoreFile))
	}
	plain, err := d.aead.Open(nil, b[:ns], b[ns:], storeAAD)
	if err != nil {
		return nil, id, fmt.Errorf("secret store: %s cannot be decrypted with %s (was the key replaced?)", filepath.Join(d.dir, StoreFile), filepath.Join(d.dir, KeyFile))
	}
	st := newState()
	if err := json.Unmarshal(plain, st); err != nil {
		return nil, id, fmt.Errorf("secret store: %s is corrupt", filepath.Join(d.dir, StoreFile))
	}
	if st.Secrets == nil {
		st.Secrets = map[string]secretRecord{}
	}
	if st.Placeholders == nil {
		st.Placeholders = map[string]placeholderRecord{}
	}
	return st, id, nil
}

func (d *diskStore) save(st *state) (fileID, error) {
	plain, err := json.Marshal(st)
	if err != nil {
		return fileID{}, fmt.Errorf("secret store: %w", err)
	}
	nonce := make([]byte, d.aead.NonceSize())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return fileID{}, fmt.Errorf("secret store: %w", err)
	}
	out := d.aead.Seal(nonce, nonce, plain, storeAAD)
	clear(plain)
	if err := atomicfile.WriteFile(filepath.Join(d.dir, StoreFile), out, 0o600); err != nil {
		return fileID{}, fmt.Errorf("secret store: %w", err)
	}
	return d.stat(), nil
}
