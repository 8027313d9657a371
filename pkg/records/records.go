// Package records keeps a directory of JSON records, one file per key (<dir>/<key>.json), each
// written through pkg/atomicfile so that a crash leaves the old record or the new, never a torn
// one. Loading skips what it cannot read (temp files of an interrupted write, damaged or foreign
// files), logs each skip and counts it, so a bad file costs its own record and nothing else.
//
// Services keep here what they must find again after a restart and that belongs to no KV bucket:
// netstack networks, mitm sandboxes, portfwd state, the gateway's worktree delegations.
package records

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Ext is the file name ending of a record.
const Ext = ".json"

// MaxKeyLen bounds a key: it becomes a file name.
const MaxKeyLen = 128

// MaxRecordBytes bounds what Load and Get read of one file: records are small by design.
const MaxRecordBytes = 4 << 20

// Store is one directory of records of type T.
type Store[T any] struct {
	dir  string
	mode os.FileMode
	log  zerolog.Logger
}

// Open returns the store in dir, creating the directory (0700) when it is missing. Records are
// written with mode 0600: they may hold tokens.
func Open[T any](dir string, log zerolog.Logger) (*Store[T], error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("records %s: %w", dir, err)
	}
	return &Store[T]{dir: dir, mode: 0o600, log: log}, nil
}

// Dir is the store's directory.
func (s *Store[T]) Dir() string { return s.dir }

// CheckKey refuses a key that is not a plain file name: empty, too long, a path, hidden, or with
// a byte outside [A-Za-z0-9._-].
func CheckKey(key string) error {
	if key == "" || len(key) > MaxKeyLen || key[0] == '.' {
		return errdefs.Invalid("record key %q: must be 1 to %d characters of letters, digits, '.', '_' or '-', not starting with '.'", clip(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return errdefs.Invalid("record key %q: must be 1 to %d characters of letters, digits, '.', '_' or '-', not starting with '.'", clip(key), MaxKeyLen)
		}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}

func (s *Store[T]) path(key string) string { return filepath.Join(s.dir, key+Ext) }

// Put writes the record of key, replacing any earlier one.
func (s *Store[T]) Put(key string, v T) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("record %s: encode: %w", key, err)
	}
	return atomicfile.WriteFile(s.path(key), append(b, '\n'), s.mode)
}

// Get reads the record of key; a missing one is errdefs.ErrNotFound.
func (s *Store[T]) Get(key string) (T, error) {
	var v T
	if err := CheckKey(key); err != nil {
		return v, err
	}
	b, err := readBounded(s.path(key))
	if errors.Is(err, os.ErrNotExist) {
		return v, errdefs.NotFound("no record %q in %s", key, s.dir)
	}
	if err != nil {
		return v, fmt.Errorf("record %s: %w", key, err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("record %s: damaged: %w", key, err)
	}
	return v, nil
}

// Update reads the record of key, lets fn change it and writes it back. A missing record is
// errdefs.ErrNotFound and fn is not called. Callers serialise updates of one key themselves.
func (s *Store[T]) Update(key string, fn func(*T) error) error {
	v, err := s.Get(key)
	if err != nil {
		return err
	}
	if err := fn(&v); err != nil {
		return err
	}
	return s.Put(key, v)
}

// Delete removes the record of key; a missing one is not an error.
func (s *Store[T]) Delete(key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if err := os.Remove(s.path(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("record %s: %w", key, err)
	}
	return nil
}

// Record is one loaded record and its key.
type Record[T any] struct {
	Key   string
	Value T
}

// Loaded is what Load found: the records in key order, and how many files it skipped.
type Loaded[T any] struct {
	Records []Record[T]
	Skipped int
}

// Load reads every record. Directories are passed over; temp files of an interrupted write
// (removed: Load runs as the store's owner starts, before it writes), files that are not
// records, unreadable and undecodable files are skipped, each logged and counted. Only a
// directory that cannot be listed is an error.
func (s *Store[T]) Load() (Loaded[T], error) {
	var out Loaded[T]
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("records %s: %w", s.dir, err)
	}
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() {
			continue // a record's working files may live beside it
		}
		skip := func(why string, err error) {
			out.Skipped++
			s.log.Warn().Err(err).Str("dir", s.dir).Str("file", name).Msg("record skipped: " + why)
		}
		if isTemp(name) && e.Type().IsRegular() {
			// Nobody writes while the store loads (its owner is starting): what a crash left
			// half-written goes, so it does not pile up over restarts.
			skip("left by an interrupted write, removed", os.Remove(filepath.Join(s.dir, name)))
			continue
		}
		key, isRecord := strings.CutSuffix(name, Ext)
		if !isRecord || CheckKey(key) != nil || !e.Type().IsRegular() {
			skip("not a record file", nil)
			continue
		}
		b, err := readBounded(filepath.Join(s.dir, name))
		if err != nil {
			skip("unreadable", err)
			continue
		}
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			skip("damaged", err)
			continue
		}
		out.Records = append(out.Records, Record[T]{Key: key, Value: v})
	}
	sort.Slice(out.Records, func(i, j int) bool { return out.Records[i].Key < out.Records[j].Key })
	return out, nil
}

// isTemp says whether name is the temp file of a write: pkg/atomicfile's .<key>.json.tmp-<n>,
// or <key>.json.tmp of earlier builds.
func isTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-") || strings.HasSuffix(name, Ext+".tmp")
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > MaxRecordBytes {
		return nil, fmt.Errorf("%d bytes, more than the %d a record may have", st.Size(), MaxRecordBytes)
	}
	b := make([]byte, st.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, err
	}
	return b, nil
}
