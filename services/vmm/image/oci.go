package image

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// OCI images (pull and import): the image's layers are applied in order into a root directory
// (extract.go), which becomes an ext4 image with mkfs.ext4 -d like the built-in images; its
// owners and modes are written after mkfs. The guest agent comes from the initramfs as for any
// image; the image's own init is not used. Compressed layers from registries are cached by digest
// under $NEXUS_CACHE/oci/blobs, and the finished ext4 under $NEXUS_CACHE/images/<key>.ext4, so a
// second pull of the same digest (in this home or another sharing the cache) is instant.

// LayerProgress receives a layer's progress: bytes done of total (its compressed size).
type LayerProgress func(layer string, done, total int64)

// PullOptions are a pull's or import's credentials, transport and bounds.
type PullOptions struct {
	Username, Password string // registry credentials; else the user's docker config
	Insecure           bool   // plain HTTP
	MaxBytes           int64  // bound on the unpacked content (0: DefaultMaxBytes)
	MaxInodes          int64  // bound on entries (0: DefaultMaxInodes)
	Layers             LayerProgress
}

// Platform is the only platform nexus guests run.
var Platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Pull fetches ref from its registry (a multi-arch index gives its linux/amd64 image) and
// installs it, tagged with ref's tag. An image already here (same digest) is only tagged.
func Pull(ctx context.Context, h home.Dir, cache, ref string, o PullOptions, progress Progress) (*Info, error) {
	if progress == nil {
		progress = func(string, float64) {}
	}
	var nopts []name.Option
	if o.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	gref, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, errdefs.Invalid("image pull %s: %v", ref, err)
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithPlatform(Platform)}
	if o.Username != "" || o.Password != "" {
		ropts = append(ropts, remote.WithAuth(&authn.Basic{Username: o.Username, Password: o.Password}))
	} else {
		ropts = append(ropts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	progress("resolve "+ref, 0.01)
	desc, err := remote.Get(gref, ropts...)
	var terr *transport.Error
	switch {
	case errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound:
		return nil, errdefs.Invalid("image pull %s: the registry has no such image or tag", ref)
	case errors.As(err, &terr) && (terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden):
		return nil, errdefs.Invalid("image pull %s: not authorized: log in (docker login) or pass --username and --password-stdin", ref)
	case err != nil:
		return nil, fmt.Errorf("image pull %s: %s", ref, oneLine(err))
	}
	var img v1.Image
	indexDigest := ""
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, fmt.Errorf("image pull %s: %s", ref, oneLine(err))
		}
		if img, err = platformImage(idx, ref); err != nil {
			return nil, err
		}
		indexDigest = desc.Digest.String()
	} else if img, err = desc.Image(); err != nil {
		return nil, fmt.Errorf("image pull %s: %s", ref, oneLine(err))
	}
	tag := ""
	if t, ok := gref.(name.Tag); ok {
		tag = t.TagStr()
	}
	return install(ctx, h, cache, img, source{
		name: displayRepo(gref.Context()), tag: tag, indexDigest: indexDigest, what: "pull " + ref, remote: true,
	}, o, progress)
}

// platformImage picks the linux/amd64 image of an index (nested indexes included).
func platformImage(idx v1.ImageIndex, what string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image %s: %s", what, oneLine(err))
	}
	var have []string
	for _, m := range im.Manifests {
		if m.MediaType.IsIndex() {
			child, err := idx.ImageIndex(m.Digest)
			if err == nil {
				if img, err := platformImage(child, what); err == nil {
					return img, nil
				}
			}
			continue
		}
		if m.Platform == nil {
			if len(im.Manifests) == 1 {
				return idx.Image(m.Digest)
			}
			continue
		}
		if m.Platform.OS == Platform.OS && m.Platform.Architecture == Platform.Architecture {
			return idx.Image(m.Digest)
		}
		if m.Platform.OS != "unknown" { // attestations
			have = append(have, m.Platform.OS+"/"+m.Platform.Architecture)
		}
	}
	return nil, errdefs.Invalid("image %s has no linux/amd64 image (it has %s)", what, strings.Join(have, ", "))
}

// Import installs the image of a docker save tarball, an OCI image layout directory or an OCI
// archive (a tar of a layout). ref names it (NAME[:TAG]); without it the tarball's own name is
// used (docker save's RepoTags, the layout's org.opencontainers.image.ref.name).
func Import(ctx context.Context, h home.Dir, cache, file, ref string, o PullOptions, progress Progress) (*Info, error) {
	if progress == nil {
		progress = func(string, float64) {}
	}
	st, err := os.Stat(file)
	if err != nil {
		return nil, errdefs.Invalid("image import: %v", err)
	}
	var img v1.Image
	var named string
	switch {
	case st.IsDir():
		img, named, err = fromLayout(file)
	default:
		var cleanup func()
		img, named, cleanup, err = fromTarball(h, file)
		defer cleanup()
	}
	if err != nil {
		return nil, err
	}
	if ref == "" {
		ref = named
	}
	if ref == "" {
		return nil, errdefs.Invalid("image import %s: the archive names no image: give it one (nexus image import FILE NAME[:TAG])", filepath.Base(file))
	}
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if slices.Contains(Known, r.Name) {
		return nil, errdefs.Invalid("image import: %s is a built-in image's name; give the image another", r.Name)
	}
	if r.Digest != "" {
		return nil, errdefs.Invalid("image import: name the image NAME[:TAG], without a digest")
	}
	return install(ctx, h, cache, img, source{name: r.Name, tag: cmpTag(r.Tag), what: "import " + filepath.Base(file)}, o, progress)
}

func fromLayout(dir string) (v1.Image, string, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", errdefs.Invalid("image import %s: not an OCI layout: %s", filepath.Base(dir), oneLine(err))
	}
	named := ""
	if im, err := idx.IndexManifest(); err == nil && len(im.Manifests) == 1 {
		named = im.Manifests[0].Annotations["org.opencontainers.image.ref.name"]
		if named != "" && !strings.ContainsAny(named, "/:") {
			named = "" // a bare tag ("1.0") names no image
		}
	}
	img, err := platformImage(idx, filepath.Base(dir))
	return img, named, err
}

// fromTarball opens a docker save tarball, or an OCI archive by unpacking its layout (regular
// files and directories only) next to the images; cleanup removes that.
func fromTarball(h home.Dir, file string) (img v1.Image, named string, cleanup func(), err error) {
	cleanup = func() {}
	img, named, dir, err := openTarball(h, file)
	if dir != "" {
		cleanup = func() { os.RemoveAll(dir) }
	}
	return img, named, cleanup, err
}

func openTarball(h home.Dir, file string) (v1.Image, string, string, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(file) }
	if m, err := tarball.LoadManifest(opener); err == nil && len(m) > 0 {
		if len(m) > 1 {
			return nil, "", "", errdefs.Invalid("image import %s: the tarball holds %d images; save one", filepath.Base(file), len(m))
		}
		named := ""
		if len(m[0].RepoTags) > 0 {
			named = m[0].RepoTags[0]
		}
		img, err := tarball.Image(opener, nil)
		if err != nil {
			return nil, "", "", errdefs.Invalid("image import %s: %s", filepath.Base(file), oneLine(err))
		}
		return img, named, "", nil
	}
	if err := os.MkdirAll(h.Images(), 0o755); err != nil {
		return nil, "", "", err
	}
	dir, err := os.MkdirTemp(h.Images(), ".import-")
	if err != nil {
		return nil, "", "", err
	}
	if err := untarLayout(file, dir); err != nil {
		return nil, "", dir, err
	}
	img, named, err := fromLayout(dir)
	if err != nil {
		return nil, "", dir, errdefs.Invalid("image import %s: neither a docker save tarball nor an OCI archive", filepath.Base(file))
	}
	return img, named, dir, nil
}

func untarLayout(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReader(f))
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil || n > 100000 {
			return errdefs.Invalid("image import %s: not a tar archive (%v)", filepath.Base(file), err)
		}
		p := path.Clean("/" + hdr.Name)
		if p == "/" || strings.Contains(hdr.Name, "..") {
			continue
		}
		dst := filepath.Join(dir, p)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			out.Close()
			if err != nil {
				return errdefs.Invalid("image import %s: %v (truncated archive?)", filepath.Base(file), err)
			}
		}
	}
}

// source is where an image being installed comes from.
type source struct {
	name, tag   string
	indexDigest string
	what        string // the record's Source
	remote      bool   // layers are fetched (and cached) compressed
}

// install converts img into an ext4 image and records it as src.name:src.tag. Nothing is left
// under the images' names unless it all worked.
func install(ctx context.Context, h home.Dir, cache string, img v1.Image, src source, o PullOptions, progress Progress) (*Info, error) {
	what := src.what
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("image %s: %s", what, oneLine(err))
	}
	key := keyOf(digest.String())
	if _, err := getOCI(h, key); err == nil { // here already: not even its config is fetched
		progress("cached", 1)
		return retag(ctx, h, key, src)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, errdefs.Invalid("image %s: bad image config: %s", what, oneLine(err))
	}
	if cfg.OS != Platform.OS || cfg.Architecture != Platform.Architecture {
		return nil, errdefs.Invalid("image %s is for %s/%s: nexus guests run linux/amd64", what, cfg.OS, cfg.Architecture)
	}
	unlock, err := lock(ctx, h, key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := getOCI(h, key); err == nil {
		progress("cached", 1)
		return retag(ctx, h, key, src)
	}
	if info, err := fromCache(h, cache, key); err == nil {
		info.Name, info.Tags, info.Source = src.name, nil, src.what // as another home had named it
		if err := writeRecord(h, info); err != nil {
			return nil, err
		}
		progress("cached", 1)
		return retag(ctx, h, key, src)
	}

	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("image %s: %s", what, oneLine(err))
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return nil, errdefs.Invalid("image %s: %d layers but %d diff ids in its config", what, len(layers), len(cfg.RootFS.DiffIDs))
	}
	start := time.Now()
	work, err := os.MkdirTemp(h.Images(), "."+key+".build-")
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", what, err)
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, err
	}
	ex, err := startExtraction(root, o.MaxBytes, o.MaxInodes)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", what, err)
	}
	x, err := extractLayers(ctx, ex, layers, cfg.RootFS.DiffIDs, cache, src.remote, o, func(label string, i int) {
		progress(label, 0.05+0.8*float64(i)/float64(len(layers)))
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", what, err)
	}
	progress("mkfs.ext4", 0.87)
	tmpImg := filepath.Join(work, key+".ext4")
	content, err := makeExt4(ctx, root, tmpImg, "nexus-oci")
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", what, err)
	}
	progress("owners", 0.94)
	if err := x.setOwners(ctx, tmpImg); err != nil {
		return nil, fmt.Errorf("image %s: %w", what, err)
	}
	if err := os.Chmod(tmpImg, 0o444); err != nil {
		return nil, err
	}
	st, err := os.Stat(tmpImg)
	if err != nil {
		return nil, err
	}
	info := Info{
		Name: src.name, Built: time.Now().UTC(), Size: st.Size(), Content: content, BuildTime: time.Since(start).Seconds(),
		Key: key, Digest: digest.String(), IndexDigest: src.indexDigest, Source: src.what, Created: cfg.Created.Time.UTC(),
		Config: &Config{Env: cfg.Config.Env, WorkingDir: cfg.Config.WorkingDir, User: cfg.Config.User,
			Entrypoint: cfg.Config.Entrypoint, Cmd: cfg.Config.Cmd, Labels: cfg.Config.Labels},
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		info.DiskUsage = sys.Blocks * 512
	}
	progress("install", 0.97)
	if err := os.Rename(tmpImg, imagePath(h, key)); err != nil {
		return nil, err
	}
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := atomicfile.WriteFile(manifestPath(h, key), b, 0o644); err != nil {
		os.Remove(imagePath(h, key))
		return nil, err
	}
	toCache(h, cache, key, b)
	if x.devices > 0 {
		progress(fmt.Sprintf("skipped %d device nodes", x.devices), 0.99)
	}
	out, err := retag(ctx, h, key, src)
	if err == nil {
		progress("done", 1)
	}
	return out, err
}

// extractLayers streams the layers, in order, to the extractor child and returns what it
// recorded. A layer that fails to open or does not match its diff id stops the child; an error
// of the child's is its own.
func extractLayers(ctx context.Context, ex *extraction, layers []v1.Layer, diffIDs []v1.Hash, cache string, remote bool, o PullOptions, step func(string, int)) (*extractor, error) {
	for i, l := range layers {
		ld, err := l.Digest()
		if err != nil {
			ex.kill()
			return nil, fmt.Errorf("layer %d: %s", i+1, oneLine(err))
		}
		label := fmt.Sprintf("layer %d/%d (%s)", i+1, len(layers), shortHex(ld.String()))
		step(label, i)
		rc, err := openLayer(ctx, cache, l, remote, o)
		if err != nil {
			ex.kill()
			return nil, fmt.Errorf("%s: %s", label, oneLine(err))
		}
		err = ex.layer(rc, label, diffIDs[i])
		rc.Close()
		if errors.Is(err, errStopped) {
			break
		}
		if err != nil {
			ex.kill()
			return nil, err
		}
	}
	return ex.finish(o.MaxBytes, o.MaxInodes)
}

// openLayer returns a layer's uncompressed stream. A registry's layer is first downloaded into
// the blob cache, checked against its digest, with progress; an archive's is read in place.
func openLayer(ctx context.Context, cache string, l v1.Layer, remote bool, o PullOptions) (io.ReadCloser, error) {
	if !remote {
		return l.Uncompressed()
	}
	d, err := l.Digest()
	if err != nil {
		return nil, err
	}
	blob := filepath.Join(cache, "oci", "blobs", d.Algorithm, d.Hex)
	if _, err := os.Stat(blob); err != nil {
		if err := fetchBlob(ctx, l, d, blob, o); err != nil {
			return nil, err
		}
	} else if o.Layers != nil {
		if size, err := l.Size(); err == nil {
			o.Layers(d.String(), size, size)
		}
	}
	f, err := os.Open(blob)
	if err != nil {
		return nil, err
	}
	return decompress(f)
}

func fetchBlob(ctx context.Context, l v1.Layer, d v1.Hash, blob string, o PullOptions) error {
	size, _ := l.Size()
	if max := o.MaxBytes; size > 0 && max > 0 && size > max {
		return errdefs.Invalid("layer %s is %d bytes: more than the image may unpack to (raise --max-size)", shortHex(d.String()), size)
	}
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(filepath.Dir(blob), "."+d.Hex+".")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	sum := sha256.New()
	w := io.MultiWriter(tmp, sum)
	var done int64
	buf := make([]byte, 256<<10)
	last := time.Time{}
	for {
		if err := ctx.Err(); err != nil {
			tmp.Close()
			return err
		}
		n, rerr := rc.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				tmp.Close()
				return err
			}
			done += int64(n)
			if o.Layers != nil && time.Since(last) > 200*time.Millisecond {
				last = time.Now()
				o.Layers(d.String(), done, size)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			tmp.Close()
			return rerr
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(sum.Sum(nil)); got != d.String() {
		return errdefs.Invalid("layer %s: downloaded content is %s: digest mismatch", shortHex(d.String()), shortHex(got))
	}
	if o.Layers != nil {
		o.Layers(d.String(), done, size)
	}
	return os.Rename(tmp.Name(), blob)
}

// decompress detects gzip, zstd or a plain tar.
func decompress(f *os.File) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(f, 1<<20)
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("corrupt layer: %v", err)
		}
		return readCloser{zr, func() error { zr.Close(); return f.Close() }}, nil
	case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("corrupt layer: %v", err)
		}
		return readCloser{zr, func() error { zr.Close(); return f.Close() }}, nil
	}
	return readCloser{br, f.Close}, nil
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

// retag gives the image with key the tag src names, taking it from any other image of the same
// name (that one keeps its digest and whatever else uses it), and returns its record.
func retag(ctx context.Context, h home.Dir, key string, src source) (*Info, error) {
	unlock, err := lock(ctx, h, "tags")
	if err != nil {
		return nil, err
	}
	defer unlock()
	list, err := listOCI(h)
	if err != nil {
		return nil, err
	}
	var self *Info
	for i := range list {
		info := &list[i]
		if info.Key == key {
			self = info
			continue
		}
		if src.tag != "" && info.Name == src.name && slices.Contains(info.Tags, src.tag) {
			info.Tags = slices.DeleteFunc(info.Tags, func(t string) bool { return t == src.tag })
			if err := writeRecord(h, info); err != nil {
				return nil, err
			}
		}
	}
	if self == nil {
		return nil, errdefs.NotFound("image %s vanished while being tagged", key)
	}
	changed := false
	if self.Name != src.name { // the same content under another name: the latest name wins
		self.Name, self.Tags, changed = src.name, nil, true
	}
	if src.tag != "" && !slices.Contains(self.Tags, src.tag) {
		self.Tags, changed = append(self.Tags, src.tag), true
	}
	if self.IndexDigest == "" && src.indexDigest != "" {
		self.IndexDigest, changed = src.indexDigest, true
	}
	if changed {
		if err := writeRecord(h, self); err != nil {
			return nil, err
		}
	}
	return self, nil
}

func writeRecord(h home.Dir, info *Info) error {
	b, _ := json.MarshalIndent(info, "", "  ")
	return atomicfile.WriteFile(manifestPath(h, info.Key), b, 0o644)
}

// RemoveRef removes an image by reference. NAME:TAG of an image with other tags only takes the
// tag away; otherwise the image goes. Callers make sure no sandbox or snapshot uses it.
func RemoveRef(h home.Dir, ref string) error {
	info, err := Resolve(h, ref)
	if err != nil {
		return err
	}
	if info.Source == "built" {
		return Remove(h, info.Name)
	}
	unlock, err := lock(context.Background(), h, "tags")
	if err != nil {
		return err
	}
	defer unlock()
	if r, err := ParseRef(ref); err == nil && r.Digest == "" && len(info.Tags) > 1 {
		info.Tags = slices.DeleteFunc(info.Tags, func(t string) bool { return t == cmpTag(r.Tag) })
		return writeRecord(h, info)
	}
	if err := os.Remove(manifestPath(h, info.Key)); err != nil {
		return fmt.Errorf("image rm %s: %w", ref, err)
	}
	if err := os.Remove(imagePath(h, info.Key)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("image rm %s: %w", ref, err)
	}
	return nil
}

func shortHex(d string) string {
	alg, hx, ok := strings.Cut(d, ":")
	if !ok || len(hx) < 12 {
		return d
	}
	return alg + ":" + hx[:12]
}

// oneLine keeps the first line of a library error (registry errors can carry bodies).
func oneLine(err error) string {
	s := strings.TrimSpace(err.Error())
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
