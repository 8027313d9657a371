// Package atomicfile writes files so that a reader, or a crash, sees the old content or the new,
// never a torn file: a temp file beside the target, synced, then renamed over it.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data, mode applied before the rename.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, true)
}

// Replace is WriteFile without the sync: a reader still sees the old content or the new, never a
// torn file, but a crash before the kernel writes the data back may leave the old content (ext4,
// the guest's root, commits a file renamed over another before the rename under its default
// data=ordered,auto_da_alloc; a file system without that ordering may leave an empty file). It
// is for files written again on every boot, such as the guest's identity, where the next write
// repairs what a crash lost and a sync would only add its disk flush to the boot.
func Replace(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, false)
}

func write(path string, data []byte, mode os.FileMode, sync bool) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op after the rename
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
