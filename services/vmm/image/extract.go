package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Bounds on what an OCI image may unpack to; PullOptions raise them.
const (
	DefaultMaxBytes  int64 = 16 << 30 // bytes of file content, over all layers
	DefaultMaxInodes int64 = 1 << 20  // entries, over all layers
)

// maxLinkTarget bounds a symlink's or hard link's target, as PATH_MAX does.
const maxLinkTarget = 4096

// extractor applies image layers, in order, to a root directory on the host. Layers are hostile
// input: every path is resolved inside the root (a symlink in the tree, absolute or not, is
// followed as the guest would see it, never out of the root), `..` in an entry is refused,
// device nodes are skipped, nothing is chowned or made setuid on the host, and content and
// entries are bounded. Owners and modes are recorded instead (meta) and written into the ext4
// image after mkfs (setOwners), so extraction needs no privilege.
type extractor struct {
	root          string
	maxBytes      int64
	maxInodes     int64
	bytes, inodes int64
	devices       int              // device nodes skipped
	meta          map[string]owner // real path inside the root ("" is the root) → owner and mode
	seen          map[string]bool  // paths written by the layer being applied
	layerName     string           // for errors: "layer 2 (sha256:abcd…)"
}

// owner is an entry's owner and permission bits (with setuid, setgid, sticky).
type owner struct {
	uid, gid int
	perm     uint32
}

func newExtractor(root string, maxBytes, maxInodes int64) *extractor {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if maxInodes <= 0 {
		maxInodes = DefaultMaxInodes
	}
	return &extractor{root: root, maxBytes: maxBytes, maxInodes: maxInodes, meta: map[string]owner{}}
}

func (x *extractor) errorf(format string, args ...any) error {
	return errdefs.Invalid("%s: %s", x.layerName, fmt.Sprintf(format, args...))
}

// apply applies one layer's tar stream.
func (x *extractor) apply(r io.Reader, name string) error {
	x.layerName = name
	x.seen = map[string]bool{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return x.errorf("bad tar stream: %v", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
}

// cleanName checks an entry name and returns its components.
func (x *extractor) cleanName(n string) ([]string, error) {
	if len(n) > maxLinkTarget {
		return nil, x.errorf("entry name of %d bytes", len(n))
	}
	var out []string
	for _, c := range strings.Split(n, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			return nil, x.errorf("path traversal in entry %q", n)
		}
		for _, r := range c {
			if r < 0x20 || r == 0x7f || r == '"' || r == '\\' {
				return nil, x.errorf("entry %q has a control character, quote or backslash in its name", n)
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// resolve returns the real path, inside the root, of the directory named by components,
// following symlinks as the guest would (an absolute target starts again at the root, `..`
// stops at the root), creating missing directories when create is set.
func (x *extractor) resolve(components []string, create bool) (string, error) {
	queue := append([]string{}, components...)
	cur := ""
	links := 0
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = parentOf(cur)
			continue
		}
		next := path.Join(cur, c)
		fi, err := os.Lstat(filepath.Join(x.root, next))
		switch {
		case errors.Is(err, os.ErrNotExist) && create:
			if err := x.count(); err != nil {
				return "", err
			}
			if err := os.Mkdir(filepath.Join(x.root, next), 0o755); err != nil {
				return "", x.errorf("%v", err)
			}
			x.meta[next] = owner{perm: 0o755}
			cur = next
		case err != nil:
			return "", x.errorf("%s: %v", next, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			if links++; links > 40 {
				return "", x.errorf("too many levels of symbolic links under %s", path.Join(components...))
			}
			target, err := os.Readlink(filepath.Join(x.root, next))
			if err != nil {
				return "", x.errorf("%v", err)
			}
			if strings.HasPrefix(target, "/") {
				cur = ""
			}
			queue = append(strings.Split(target, "/"), queue...)
		case fi.IsDir():
			cur = next
		default:
			return "", x.errorf("%s is not a directory", next)
		}
	}
	return cur, nil
}

func parentOf(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[:i]
	}
	return ""
}

func (x *extractor) count() error {
	if x.inodes++; x.inodes > x.maxInodes {
		return x.errorf("the image has more than %d files: raise --max-inodes", x.maxInodes)
	}
	return nil
}

func (x *extractor) host(rel string) string { return filepath.Join(x.root, rel) }

// clear removes whatever is at rel (not following a symlink there), unless keepDir and it is a
// directory.
func (x *extractor) clear(rel string, keepDir bool) error {
	fi, err := os.Lstat(x.host(rel))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return x.errorf("%v", err)
	}
	if keepDir && fi.IsDir() {
		return nil
	}
	if err := os.RemoveAll(x.host(rel)); err != nil {
		return x.errorf("%v", err)
	}
	return nil
}

func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	comps, err := x.cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if len(comps) == 0 { // the root itself
		if hdr.Typeflag == tar.TypeDir {
			x.meta[""] = x.ownerOf(hdr)
		}
		return nil
	}
	base := comps[len(comps)-1]
	parent, err := x.resolve(comps[:len(comps)-1], true)
	if err != nil {
		return err
	}
	rel := path.Join(parent, base)

	// Whiteouts hide what lower layers put there.
	if base == ".wh..wh..opq" {
		ents, err := os.ReadDir(x.host(parent))
		if err != nil {
			return x.errorf("%v", err)
		}
		for _, e := range ents {
			if p := path.Join(parent, e.Name()); !x.seen[p] {
				if err := x.clear(p, false); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if hidden, ok := strings.CutPrefix(base, ".wh."); ok {
		if hidden == "" || hidden == "." || hidden == ".." {
			return x.errorf("bad whiteout %q", hdr.Name)
		}
		return x.clear(path.Join(parent, hidden), false)
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > 1<<31 || hdr.Gid > 1<<31 {
		return x.errorf("%s: owner %d:%d out of range", hdr.Name, hdr.Uid, hdr.Gid)
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := x.clear(rel, true); err != nil {
			return err
		}
		if _, err := os.Lstat(x.host(rel)); errors.Is(err, os.ErrNotExist) {
			if err := x.count(); err != nil {
				return err
			}
			if err := os.Mkdir(x.host(rel), 0o755); err != nil {
				return x.errorf("%v", err)
			}
		}
	case tar.TypeReg, tar.TypeRegA:
		if err := x.clear(rel, false); err != nil {
			return err
		}
		if err := x.count(); err != nil {
			return err
		}
		if hdr.Size < 0 || hdr.Size > x.maxBytes-x.bytes {
			return x.errorf("the image unpacks to more than %d bytes: raise --max-size", x.maxBytes)
		}
		f, err := os.OpenFile(x.host(rel), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, hostPerm(hdr.Mode, 0o600))
		if err != nil {
			return x.errorf("%v", err)
		}
		n, err := io.Copy(f, io.LimitReader(tr, hdr.Size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		x.bytes += n
		if err == nil && n != hdr.Size {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return x.errorf("%s: %v (truncated or corrupt layer)", hdr.Name, err)
		}
	case tar.TypeSymlink:
		if len(hdr.Linkname) > maxLinkTarget || hdr.Linkname == "" {
			return x.errorf("%s: bad symlink target", hdr.Name)
		}
		if err := x.clear(rel, false); err != nil {
			return err
		}
		if err := x.count(); err != nil {
			return err
		}
		if err := os.Symlink(hdr.Linkname, x.host(rel)); err != nil {
			return x.errorf("%v", err)
		}
	case tar.TypeLink:
		lcomps, err := x.cleanName(hdr.Linkname)
		if err != nil {
			return err
		}
		if len(lcomps) == 0 {
			return x.errorf("%s: hard link to the root", hdr.Name)
		}
		lparent, err := x.resolve(lcomps[:len(lcomps)-1], false)
		if err != nil {
			return err
		}
		src := path.Join(lparent, lcomps[len(lcomps)-1])
		fi, err := os.Lstat(x.host(src))
		if err != nil || fi.IsDir() {
			return x.errorf("%s: hard link to %s, which is not a file in the image", hdr.Name, hdr.Linkname)
		}
		if src == rel {
			return nil
		}
		if err := x.clear(rel, false); err != nil {
			return err
		}
		if err := os.Link(x.host(src), x.host(rel)); err != nil {
			return x.errorf("%v", err)
		}
		if m, ok := x.meta[src]; ok {
			x.meta[rel] = m // one inode: the owner it already has
		}
		x.seen[rel] = true
		return nil
	case tar.TypeFifo:
		if err := x.clear(rel, false); err != nil {
			return err
		}
		if err := x.count(); err != nil {
			return err
		}
		if err := syscall.Mkfifo(x.host(rel), 0o600); err != nil {
			return x.errorf("%v", err)
		}
	case tar.TypeChar, tar.TypeBlock:
		x.devices++ // the guest's /dev is devtmpfs; an image's device nodes are not made on the host
		return nil
	default:
		return nil // pax/GNU metadata entries, sockets: nothing to make
	}
	x.meta[rel] = x.ownerOf(hdr)
	x.seen[rel] = true
	return nil
}

func (x *extractor) ownerOf(hdr *tar.Header) owner {
	return owner{uid: hdr.Uid, gid: hdr.Gid, perm: uint32(hdr.Mode) & 0o7777}
}

// hostPerm is the mode an entry gets on the host: its rwx bits without setuid/setgid/sticky and
// without group or other write, readable and writable by the extracting user.
func hostPerm(mode int64, min fs.FileMode) fs.FileMode {
	return fs.FileMode(mode)&0o755 | min
}

// finish makes the directories the guest agent mounts over, when the image lacks them.
func (x *extractor) finish() error {
	for _, d := range []struct {
		p    string
		perm uint32
	}{{"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"run", 0o755}, {"tmp", 0o1777}, {"workspace", 0o755}} {
		if _, err := os.Lstat(x.host(d.p)); errors.Is(err, os.ErrNotExist) {
			if err := os.Mkdir(x.host(d.p), 0o755); err != nil {
				return err
			}
			x.meta[d.p] = owner{perm: d.perm}
		}
	}
	return nil
}

// setOwners writes the recorded owners and modes into the ext4 image made from the root, with
// debugfs: mkfs.ext4 -d took them from the host files, which the extraction did not chown.
func (x *extractor) setOwners(ctx context.Context, img string) error {
	var script bytes.Buffer
	var paths []string
	err := filepath.WalkDir(x.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(x.root, p)
		if rel == "." {
			rel = ""
		}
		paths = append(paths, rel)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	for _, rel := range paths {
		fi, err := os.Lstat(x.host(rel))
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		want, ok := x.meta[rel]
		if !ok {
			want = owner{perm: st.Mode & 0o7777}
		}
		q := `"/` + rel + `"`
		if int(st.Uid) != want.uid {
			fmt.Fprintf(&script, "sif %s uid %d\n", q, want.uid)
		}
		if int(st.Gid) != want.gid {
			fmt.Fprintf(&script, "sif %s gid %d\n", q, want.gid)
		}
		if fi.Mode()&fs.ModeSymlink == 0 && st.Mode&0o7777 != want.perm {
			fmt.Fprintf(&script, "sif %s mode 0%o\n", q, st.Mode&syscall.S_IFMT|want.perm)
		}
	}
	if script.Len() == 0 {
		return nil
	}
	cmdFile := img + ".owners"
	if err := os.WriteFile(cmdFile, script.Bytes(), 0o600); err != nil {
		return err
	}
	defer os.Remove(cmdFile)
	cmd := exec.CommandContext(ctx, "debugfs", "-w", "-f", cmdFile, img)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("debugfs: %w: %s", err, lastLine(stderr.String()))
	}
	// debugfs exits 0 after failed commands; its banner is the only line it writes otherwise.
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "debugfs ") {
			return fmt.Errorf("debugfs: %s", l)
		}
	}
	return nil
}
