// Package fsutil holds the file helpers of snapshots and forks: copying a large, mostly empty
// file (a guest RAM file, a disk image) without writing its holes, and making a rename durable.
package fsutil

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// CopySparse copies src to a new file dst: a reflink where the filesystem has them, otherwise
// skipping holes (SEEK_DATA/SEEK_HOLE) with copy_file_range where the kernel offers it. It
// returns the bytes of data copied (src's length for a reflink); dst has src's length.
func CopySparse(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return 0, err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	var copied int64
	fail := func(err error) (int64, error) {
		out.Close()
		os.Remove(dst)
		return 0, err
	}
	// A reflink (btrfs, xfs) shares the blocks copy-on-write: constant time whatever the size.
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return size, out.Close()
	}
	if err := out.Truncate(size); err != nil {
		return fail(err)
	}
	fd := int(in.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fail(err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fail(err)
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return fail(err)
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return fail(err)
		}
		n, err := out.ReadFrom(io.LimitReader(in, hole-data))
		copied += n
		if err != nil {
			return fail(err)
		}
		if n != hole-data {
			return fail(fmt.Errorf("copy %s: short copy", src))
		}
		off = hole
	}
	if err := out.Sync(); err != nil {
		return fail(err)
	}
	return copied, out.Close()
}

// SyncDir flushes a directory's entries to disk, so a rename into it survives a crash. It is
// best effort: an error leaves the rename done, only perhaps not yet durable.
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
