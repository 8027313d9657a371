package cli

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/IniZio/nexus/pkg/dockerfile"
)

// Bounds on a build context (it is untrusted input: a checkout may hold anything).
const (
	defaultMaxContext = 1 << 30
	maxContextFiles   = 1 << 17
)

// buildContext is the files of a build context directory that .dockerignore leaves, read
// through an os.Root so that no symbolic link (nor a file swapped for one) reaches outside it.
// Links are copied as links, never followed.
type buildContext struct {
	dir     string
	root    *os.Root
	entries []ctxEntry // sorted by path
}

type ctxEntry struct {
	rel  string // slash-separated, relative to the context; "." is the context itself
	mode fs.FileMode
	size int64
	link string
}

func loadContext(dir string, maxBytes int64) (*buildContext, error) {
	if maxBytes <= 0 {
		maxBytes = defaultMaxContext
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	bc := &buildContext{dir: dir, root: root}
	ignore, err := readDockerignore(root)
	if err != nil {
		root.Close()
		return nil, err
	}
	var total int64
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != "." && ignore.excluded(p) {
			if d.IsDir() && !ignore.hasExceptions {
				return fs.SkipDir
			}
			return nil
		}
		if strings.ContainsAny(p, "\n\r") {
			return fmt.Errorf("%q: a file name with a line break", p)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		e := ctxEntry{rel: p, mode: fi.Mode()}
		switch {
		case fi.Mode().IsRegular():
			e.size = fi.Size()
			total += e.size
		case fi.Mode()&fs.ModeSymlink != 0:
			if e.link, err = root.Readlink(p); err != nil {
				return err
			}
		case fi.IsDir():
		default:
			return nil // sockets, devices, fifos: not part of an image
		}
		if total > maxBytes {
			return fmt.Errorf("larger than %d MiB (--max-context raises it; .dockerignore leaves files out)", maxBytes>>20)
		}
		if len(bc.entries) >= maxContextFiles {
			return fmt.Errorf("more than %d files (.dockerignore leaves files out)", maxContextFiles)
		}
		bc.entries = append(bc.entries, e)
		return nil
	})
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("build context %s: %w", dir, err)
	}
	sort.Slice(bc.entries, func(i, j int) bool { return bc.entries[i].rel < bc.entries[j].rel })
	return bc, nil
}

func (bc *buildContext) Close() {
	if bc != nil {
		bc.root.Close()
	}
}

// dockerignore is a .dockerignore's patterns; the last one to match a path (or a directory
// above it) decides, and a pattern starting with ! keeps what it matches.
type dockerignore struct {
	pats          []ignorePattern
	hasExceptions bool
}

type ignorePattern struct {
	re     *regexp.Regexp
	negate bool
}

func readDockerignore(root *os.Root) (dockerignore, error) {
	var di dockerignore
	f, err := root.Open(".dockerignore")
	if errors.Is(err, fs.ErrNotExist) {
		return di, nil
	}
	if err != nil {
		return di, fmt.Errorf(".dockerignore: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		neg := strings.HasPrefix(l, "!")
		l = strings.TrimPrefix(l, "!")
		l = strings.TrimPrefix(path.Clean("/"+strings.TrimSpace(l)), "/")
		re, err := globRegexp(l)
		if err != nil {
			return di, fmt.Errorf(".dockerignore: %q: %v", l, err)
		}
		di.pats = append(di.pats, ignorePattern{re, neg})
		di.hasExceptions = di.hasExceptions || neg
	}
	return di, sc.Err()
}

func (di dockerignore) excluded(p string) bool {
	out := false
	for _, pat := range di.pats {
		for q := p; q != "." && q != "/"; q = path.Dir(q) {
			if pat.re.MatchString(q) {
				out = !pat.negate
				break
			}
		}
	}
	return out
}

// globRegexp compiles a glob: * and ? within a path element, ** across elements, [...] classes.
func globRegexp(g string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(g); i++ {
		switch c := g[i]; c {
		case '*':
			if i+1 < len(g) && g[i+1] == '*' {
				i++
				if i+1 < len(g) && g[i+1] == '/' {
					i++
					b.WriteString("(.*/)?")
				} else {
					b.WriteString(".*")
				}
			} else {
				b.WriteString("[^/]*")
			}
		case '?':
			b.WriteString("[^/]")
		case '[':
			j := strings.IndexByte(g[i:], ']')
			if j < 0 {
				return nil, errors.New("unterminated [")
			}
			cls := g[i+1 : i+j]
			if strings.HasPrefix(cls, "!") {
				cls = "^" + cls[1:]
			}
			b.WriteString("[" + cls + "]")
			i += j
		case '\\':
			if i+1 < len(g) {
				i++
			}
			b.WriteString(regexp.QuoteMeta(string(g[i])))
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// copyItem is one file, directory or link a COPY writes: where it comes from in the context
// and where it lands in the image (absolute).
type copyItem struct {
	ctxEntry
	dst string
}

// copyPlan resolves a COPY's sources in the context: a directory's contents go under the
// destination, a file goes into it (a destination ending in /) or becomes it.
func (bc *buildContext) copyPlan(st dockerfile.Step) ([]copyItem, error) {
	var out []copyItem
	for _, src := range st.Sources {
		pat := path.Clean("/" + src)
		if strings.HasPrefix(path.Clean(src), "..") {
			return nil, fmt.Errorf("%s is outside the build context", src)
		}
		pat = strings.TrimPrefix(pat, "/")
		if pat == "" {
			pat = "."
		}
		re, err := globRegexp(pat)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", src, err)
		}
		found := false
		for i, e := range bc.entries {
			if !re.MatchString(e.rel) {
				continue
			}
			found = true
			if !e.mode.IsDir() {
				dst := st.Dest
				if strings.HasSuffix(dst, "/") {
					dst += path.Base(e.rel)
				}
				out = append(out, copyItem{e, dst})
				continue
			}
			dir := destDir(st.Dest)
			prefix := e.rel + "/"
			if e.rel == "." {
				prefix = ""
			}
			out = bc.under(out, bc.entries[i+1:], prefix, dir)
		}
		if !found && !strings.ContainsAny(pat, "*?[\\") {
			// A directory .dockerignore leaves out, whose exceptions (!dir/file) are in.
			n := len(out)
			out = bc.under(out, bc.entries, pat+"/", destDir(st.Dest))
			found = len(out) > n
		}
		if !found {
			return nil, fmt.Errorf("%s: no such file in the build context (or .dockerignore leaves it out)", src)
		}
	}
	return out, nil
}

func destDir(dest string) string {
	if d := strings.TrimSuffix(dest, "/"); d != "" {
		return d
	}
	return "/"
}

// under appends the entries under prefix, placed under dir.
func (bc *buildContext) under(out []copyItem, entries []ctxEntry, prefix, dir string) []copyItem {
	for _, sub := range entries {
		if prefix != "" && !strings.HasPrefix(sub.rel, prefix) {
			continue
		}
		out = append(out, copyItem{sub, path.Join(dir, strings.TrimPrefix(sub.rel, prefix))})
	}
	return out
}

// writeTar writes items as a tar stream rooted at the guest's /, owned by root (timeless: every
// mtime zero, for the cache key).
func (bc *buildContext) writeTar(w io.Writer, items []copyItem, timeless bool) error {
	tw := tar.NewWriter(w)
	for _, it := range items {
		h := &tar.Header{Name: strings.TrimPrefix(it.dst, "/"), Mode: int64(it.mode.Perm()), Uname: "root", Gname: "root"}
		if it.mode&fs.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if it.mode&fs.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		switch {
		case it.mode.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case it.mode&fs.ModeSymlink != 0:
			h.Typeflag, h.Linkname = tar.TypeSymlink, it.link
		default:
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		f, err := bc.root.Open(it.rel)
		if err != nil {
			return err
		}
		fi, err := f.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			f.Close()
			return fmt.Errorf("%s changed while building", it.rel)
		}
		h.Size = fi.Size()
		if !timeless {
			h.ModTime = fi.ModTime()
		}
		if err := tw.WriteHeader(h); err == nil {
			_, err = io.CopyN(tw, f, h.Size)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", it.rel, err)
		}
	}
	return tw.Close()
}

// copyDigest is a hash of what a COPY writes (names, modes, contents, not times): its part of
// the cache key.
func (bc *buildContext) copyDigest(items []copyItem) (string, error) {
	h := sha256.New()
	if err := bc.writeTar(h, items, true); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
