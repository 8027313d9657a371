package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// Export writes the image ref as a docker save tarball (one layer: the image's root, with its
// owners and modes; its config) to file, which `nexus image import` and `docker load` read.
// The root is read out of the ext4 with debugfs (rdump for contents, ls -p for owners, modes
// and hard links), without mounting it. file is written beside itself and renamed when whole.
func Export(ctx context.Context, h home.Dir, ref, file string, progress Progress) (*Info, error) {
	if progress == nil {
		progress = func(string, float64) {}
	}
	info, err := Resolve(h, ref)
	if err != nil {
		return nil, err
	}
	if err := needTools("debugfs"); err != nil {
		return nil, err
	}
	tag := "latest"
	if r, err := ParseRef(ref); err == nil && r.Tag != "" {
		tag = r.Tag
	} else if len(info.Tags) > 0 {
		tag = info.Tags[0]
	}
	repo := info.Name
	t, err := name.NewTag(repo+":"+tag, name.WeakValidation)
	if err != nil {
		return nil, errdefs.Invalid("image save %s: %v", ref, err)
	}
	work, err := os.MkdirTemp(filepath.Dir(file), ".nexus-save-")
	if err != nil {
		return nil, fmt.Errorf("image save %s: %w", ref, err)
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		return nil, err
	}
	progress("read root", 0.1)
	if out, err := exec.CommandContext(ctx, "debugfs", "-R", "rdump / "+root, info.Path).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("image save %s: debugfs rdump: %v: %s", ref, err, errdefs.FirstLine(string(out)))
	}
	meta, err := listOwners(ctx, info.Path, root)
	if err != nil {
		return nil, fmt.Errorf("image save %s: %w", ref, err)
	}
	progress("layer", 0.4)
	layerPath := filepath.Join(work, "layer.tar")
	if err := writeRootTar(root, layerPath, meta); err != nil {
		return nil, fmt.Errorf("image save %s: %w", ref, err)
	}
	layer, err := tarball.LayerFromFile(layerPath)
	if err != nil {
		return nil, fmt.Errorf("image save %s: %w", ref, err)
	}
	cfg := &v1.ConfigFile{OS: Platform.OS, Architecture: Platform.Architecture, Created: v1.Time{Time: info.Created}}
	if c := info.Config; c != nil {
		cfg.Config = v1.Config{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd, Labels: c.Labels}
		if len(c.ExposedPorts) > 0 {
			cfg.Config.ExposedPorts = map[string]struct{}{}
			for _, p := range c.ExposedPorts {
				cfg.Config.ExposedPorts[p] = struct{}{}
			}
		}
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err == nil {
		img, err = mutate.AppendLayers(img, layer)
	}
	if err != nil {
		return nil, fmt.Errorf("image save %s: %w", ref, err)
	}
	progress("write", 0.7)
	tmp := filepath.Join(work, "image.tar")
	if err := tarball.WriteToFile(tmp, t, img); err != nil {
		return nil, fmt.Errorf("image save %s: %s", ref, oneLine(err))
	}
	if err := os.Rename(tmp, file); err != nil {
		return nil, fmt.Errorf("image save %s: %w", ref, err)
	}
	progress("done", 1)
	return info, nil
}

// entryMeta is what debugfs says of a path in the image: the root tree rdump wrote has the
// contents, not (without privileges) the owners.
type entryMeta struct {
	inode    uint64
	mode     int64 // permission bits (with setuid, setgid, sticky)
	typ      int64 // the S_IFMT bits
	uid, gid int
}

// listOwners runs one debugfs over every directory of the dumped tree (ls -p) and returns the
// entries by image path.
func listOwners(ctx context.Context, img, root string) (map[string]entryMeta, error) {
	var cmds bytes.Buffer
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			ip := path.Clean("/" + filepath.ToSlash(rel))
			if strings.ContainsAny(ip, "\"\n") {
				return fmt.Errorf("a directory name debugfs cannot be given: %q", ip)
			}
			fmt.Fprintf(&cmds, "ls -p \"%s\"\n", ip)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	cmdFile := filepath.Join(filepath.Dir(root), "debugfs.cmds")
	if err := os.WriteFile(cmdFile, cmds.Bytes(), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "debugfs", "-f", cmdFile, img)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	meta := map[string]entryMeta{}
	dir := ""
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if d, ok := strings.CutPrefix(l, "debugfs: ls -p "); ok {
			dir = strings.Trim(d, `"`)
			continue
		}
		// /inode/mode/uid/gid/name/size/
		f := strings.Split(l, "/")
		if len(f) < 7 || f[0] != "" || f[5] == "." || f[5] == ".." || f[5] == "" {
			continue
		}
		ino, e1 := strconv.ParseUint(f[1], 10, 64)
		mode, e2 := strconv.ParseInt(f[2], 8, 64)
		uid, e3 := strconv.Atoi(f[3])
		gid, e4 := strconv.Atoi(f[4])
		if e1 != nil || e2 != nil || e3 != nil || e4 != nil {
			continue
		}
		name := strings.Join(f[5:len(f)-2], "/") // names have no /; keep what debugfs printed
		meta[path.Join(dir, name)] = entryMeta{inode: ino, mode: mode & 0o7777, typ: mode &^ 0o7777, uid: uid, gid: gid}
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("debugfs ls: %w", err)
	}
	return meta, sc.Err()
}

// writeRootTar writes the dumped root as one layer: owners and modes from meta, hard links
// as links to the first path of their inode, lost+found left out.
func writeRootTar(root, file string, meta map[string]entryMeta) error {
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, root+string(filepath.Separator)))
		if rel == "lost+found" {
			return fs.SkipDir
		}
		paths = append(paths, rel)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	first := map[uint64]string{}
	for _, rel := range paths {
		hp := filepath.Join(root, filepath.FromSlash(rel))
		fi, err := os.Lstat(hp)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(hp); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			continue // not a file, directory or link
		}
		hdr.Name, hdr.Uname, hdr.Gname = rel, "", ""
		hdr.Uid, hdr.Gid = 0, 0
		if m, ok := meta["/"+rel]; ok {
			hdr.Mode, hdr.Uid, hdr.Gid = m.mode, m.uid, m.gid
			if fi.Mode().IsRegular() {
				if prev, seen := first[m.inode]; seen {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, prev, 0
				} else {
					first[m.inode] = rel
				}
			}
		}
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		src, err := os.Open(hp)
		if err != nil {
			return err
		}
		_, err = io.CopyN(tw, src, hdr.Size)
		src.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}
