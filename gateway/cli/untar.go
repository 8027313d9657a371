package cli

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Bounds of a copy out of a sandbox: what a guest sends is untrusted.
const (
	MaxCopyBytes   = 64 << 30 // file contents, in all
	MaxCopyEntries = 1 << 20
)

// untar unpacks the tar stream r under root, every entry being top or under it. Entries that
// would land outside (absolute, ..), or write through a symbolic link, refuse the whole copy;
// hard links, devices, FIFOs and symbolic links that are absolute or leave top are left out
// with a warning. Modes are kept without setuid, setgid and sticky bits. It returns the bytes
// of file contents written.
func untar(r io.Reader, root, top string, warn io.Writer) (int64, error) {
	tr := tar.NewReader(r)
	var total int64
	type dirMode struct {
		path string
		mode fs.FileMode
	}
	var dirs []dirMode
	for entries := 0; ; entries++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return total, fmt.Errorf("a broken tar stream: %w", err)
		}
		if entries == MaxCopyEntries {
			return total, fmt.Errorf("more than %d entries", MaxCopyEntries)
		}
		name, err := entryName(h.Name, top)
		if err != nil {
			return total, err
		}
		dest := filepath.Join(root, filepath.FromSlash(name))
		if err := safeParents(root, name); err != nil {
			return total, err
		}
		mode := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(dest); err == nil && !fi.IsDir() {
				return total, fmt.Errorf("%s: a directory over a non-directory", name)
			} else if err != nil {
				if err := os.Mkdir(dest, 0o700); err != nil {
					return total, err
				}
			}
			dirs = append(dirs, dirMode{dest, mode})
		case tar.TypeReg:
			if h.Size < 0 || h.Size > MaxCopyBytes-total {
				return total, fmt.Errorf("more than %d bytes", int64(MaxCopyBytes))
			}
			if fi, err := os.Lstat(dest); err == nil {
				if fi.IsDir() {
					return total, fmt.Errorf("%s: a file over a directory", name)
				}
				os.Remove(dest) // never write through what is there
			}
			f, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return total, err
			}
			n, err := io.CopyN(f, tr, h.Size)
			total += n
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return total, fmt.Errorf("%s: %w", name, err)
			}
			if err := os.Chmod(dest, mode); err != nil {
				return total, err
			}
		case tar.TypeSymlink:
			if why := badLink(name, h.Linkname, top); why != "" {
				fmt.Fprintf(warn, "nexus: cp: left out %s -> %s: %s\n", name, h.Linkname, why)
				continue
			}
			if _, err := os.Lstat(dest); err == nil {
				os.Remove(dest)
			}
			if err := os.Symlink(h.Linkname, dest); err != nil {
				return total, err
			}
		default:
			fmt.Fprintf(warn, "nexus: cp: left out %s: %s\n", name, entryKind(h.Typeflag))
		}
	}
	// Directory modes last: a read-only directory is filled before it becomes one.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Chmod(dirs[i].path, dirs[i].mode); err != nil {
			return total, err
		}
	}
	return total, nil
}

// entryName is a tar entry's name made relative and clean, refused unless it is top or under it.
func entryName(raw, top string) (string, error) {
	name := path.Clean(strings.TrimPrefix(raw, "./"))
	if raw == "./" || raw == "." {
		name = "."
	}
	if path.IsAbs(raw) || name == ".." || strings.HasPrefix(name, "../") {
		return "", fmt.Errorf("refused: the entry %q would land outside the destination", raw)
	}
	if top != "." && name != top && !strings.HasPrefix(name, top+"/") {
		return "", fmt.Errorf("refused: the entry %q is not under %s, what was asked for", raw, top)
	}
	return name, nil
}

// safeParents refuses an entry whose parent directories under root include a symbolic link
// (made by an earlier entry): nothing is written through a link.
func safeParents(root, name string) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	p := root
	for _, part := range strings.Split(dir, "/") {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("refused: the entry %q goes through the symbolic link %s", name, part)
		case !fi.IsDir():
			return fmt.Errorf("refused: the entry %q is under the non-directory %s", name, part)
		}
	}
	return nil
}

// badLink says why a symbolic link is left out: absolute, or pointing outside top.
func badLink(name, link, top string) string {
	if path.IsAbs(link) {
		return "an absolute link"
	}
	to := path.Join(path.Dir(name), link)
	if to == ".." || strings.HasPrefix(to, "../") || top != "." && to != top && !strings.HasPrefix(to, top+"/") {
		return "it points outside what is copied"
	}
	return ""
}

func entryKind(t byte) string {
	switch t {
	case tar.TypeLink:
		return "a hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "a device"
	case tar.TypeFifo:
		return "a FIFO"
	}
	return fmt.Sprintf("an entry of type %q", t)
}

// place moves what was unpacked at src to target: a rename when target is missing or neither
// is a directory, the children one by one into a directory that exists.
func place(src, target string) error {
	sfi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	tfi, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return os.Rename(src, target)
	case err != nil:
		return err
	case sfi.IsDir() && tfi.IsDir():
		children, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, c := range children {
			if err := place(filepath.Join(src, c.Name()), filepath.Join(target, c.Name())); err != nil {
				return err
			}
		}
		return nil
	case sfi.IsDir():
		return fmt.Errorf("cannot overwrite the non-directory %s with a directory", target)
	case tfi.IsDir():
		return fmt.Errorf("cannot overwrite the directory %s with a non-directory", target)
	}
	return os.Rename(src, target)
}
