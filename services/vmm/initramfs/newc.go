package initramfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// File types in a newc header's mode field.
const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeSymlink = 0o120000
	modeChar    = 0o020000
)

// Archive is an in-memory file tree written out as a deterministic newc cpio: entries sorted by
// path, parents before children, every mtime/uid/gid zero, inode numbers assigned in order.
type Archive struct {
	entries map[string]entry
}

type entry struct {
	mode         uint32 // type | permission bits
	data         []byte // file contents or symlink target
	major, minor uint32 // device numbers for character devices
}

// NewArchive returns an empty archive.
func NewArchive() *Archive { return &Archive{entries: map[string]entry{}} }

func clean(name string) (string, error) {
	n := strings.TrimPrefix(path.Clean("/"+name), "/")
	if n == "" || n == "." || strings.Contains(n, "\x00") {
		return "", fmt.Errorf("initramfs: bad path %q", name)
	}
	return n, nil
}

func (a *Archive) add(name string, e entry) error {
	n, err := clean(name)
	if err != nil {
		return err
	}
	if old, ok := a.entries[n]; ok && !(old.mode&0o170000 == modeDir && e.mode&0o170000 == modeDir) {
		return fmt.Errorf("initramfs: duplicate path %s", n)
	}
	// Parents are directories 0755 unless added explicitly.
	for p := path.Dir(n); p != "."; p = path.Dir(p) {
		if _, ok := a.entries[p]; !ok {
			a.entries[p] = entry{mode: modeDir | 0o755}
		} else if a.entries[p].mode&0o170000 != modeDir {
			return fmt.Errorf("initramfs: %s: parent %s is not a directory", n, p)
		}
	}
	a.entries[n] = e
	return nil
}

// Dir adds a directory.
func (a *Archive) Dir(name string, perm fs.FileMode) error {
	return a.add(name, entry{mode: modeDir | unixPerm(perm)})
}

func unixPerm(perm fs.FileMode) uint32 {
	m := uint32(perm.Perm())
	if perm&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	if perm&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if perm&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	return m
}

// File adds a regular file.
func (a *Archive) File(name string, perm fs.FileMode, data []byte) error {
	return a.add(name, entry{mode: modeFile | unixPerm(perm), data: data})
}

// Symlink adds a symbolic link to target.
func (a *Archive) Symlink(name, target string) error {
	if target == "" {
		return errors.New("initramfs: empty symlink target")
	}
	return a.add(name, entry{mode: modeSymlink | 0o777, data: []byte(target)})
}

// CharDev adds a character device node.
func (a *Archive) CharDev(name string, perm fs.FileMode, major, minor uint32) error {
	return a.add(name, entry{mode: modeChar | uint32(perm.Perm()), major: major, minor: minor})
}

// WriteTo writes the archive as newc cpio, ending with the TRAILER!!! record.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	// Sorting by path components keeps every directory before its children ("a" < "a/b"),
	// which a plain byte sort would break with siblings like "a-b".
	sort.Slice(names, func(i, j int) bool { return lessPath(names[i], names[j]) })
	cw := &countWriter{w: w}
	for i, n := range names {
		e := a.entries[n]
		if err := writeRecord(cw, uint32(i+1), n, e); err != nil {
			return cw.n, err
		}
	}
	if err := writeRecord(cw, 0, "TRAILER!!!", entry{}); err != nil {
		return cw.n, err
	}
	return cw.n, nil
}

func lessPath(a, b string) bool {
	as, bs := strings.Split(a, "/"), strings.Split(b, "/")
	for i := 0; i < len(as) && i < len(bs); i++ {
		if as[i] != bs[i] {
			return as[i] < bs[i]
		}
	}
	return len(as) < len(bs)
}

func writeRecord(w *countWriter, ino uint32, name string, e entry) error {
	nlink := uint32(1)
	if e.mode&0o170000 == modeDir {
		nlink = 2
	}
	size := uint32(len(e.data))
	if e.mode&0o170000 == modeDir || e.mode&0o170000 == modeChar {
		size = 0
	}
	if uint64(len(e.data)) > 0xffffffff {
		return fmt.Errorf("initramfs: %s is too large for newc", name)
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, e.mode, 0, 0, nlink, 0, size, 0, 0, e.major, e.minor, len(name)+1, 0)
	if _, err := io.WriteString(w, hdr+name+"\x00"); err != nil {
		return err
	}
	if err := w.pad(); err != nil {
		return err
	}
	if size > 0 {
		if _, err := w.Write(e.data); err != nil {
			return err
		}
		if err := w.pad(); err != nil {
			return err
		}
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// pad writes zero bytes up to the next 4-byte boundary.
func (c *countWriter) pad() error {
	if r := c.n % 4; r != 0 {
		_, err := c.Write(make([]byte, 4-r))
		return err
	}
	return nil
}
