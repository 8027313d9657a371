// Package image builds and manages the guests' ext4 root images (DESIGN §4, §8).
//
//	nexus-mini   busybox-static from Debian: /bin/busybox, its applet links, passwd/group; seconds
//	nexus-base   debootstrap --variant=minbase bookworm + ca-certificates, git, curl, openssh-client, gh
//	nexus-agent-base  nexus-base + Debian's nodejs and npm + @anthropic-ai/claude-code from npm
//
// Images are made with `mkfs.ext4 -d` from a root directory (no loop mounts, works without
// privileges for nexus-mini) into sparse files sized content + headroom. They live in
// $NEXUS_HOME/images/<name>.ext4 beside <name>.json, a small manifest. A build writes temp files
// and renames them into place under an flock, so concurrent builders and crashes never leave a
// half-built image under the real name. Downloaded debs are cached under $NEXUS_HOME/cache/debs.
//
// Each sandbox boots the image read-only through its own qcow2 overlay (NewOverlay).
package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// Names of the images nexus can build.
const (
	Mini      = "nexus-mini"
	Base      = "nexus-base"
	AgentBase = "nexus-agent-base"
)

// Known lists the buildable image names.
var Known = []string{Base, Mini, AgentBase}

// Progress receives named build steps and a completion fraction in [0,1]; it may be nil.
type Progress func(step string, frac float64)

// Info is an image's manifest. Built-in images are stored under their name; OCI images
// (pulled or imported, oci.go) under their key, "sha256-<hex of the manifest digest>", so a tag
// that moves to another digest never replaces a base that overlays or snapshots depend on.
// Records written before tags existed have only the first fields and load as built-ins.
type Info struct {
	Name      string    `json:"name"`
	Built     time.Time `json:"built"`
	Size      int64     `json:"size"`       // apparent size of the ext4 file
	DiskUsage int64     `json:"disk_usage"` // bytes allocated on the host (the file is sparse)
	Content   int64     `json:"content"`    // bytes of files in the root tree
	BuildTime float64   `json:"build_seconds"`

	// Key names the image's files in $NEXUS_HOME/images: the name of a built-in image.
	Key string `json:"key,omitempty"`
	// Tags of an OCI image (one digest may carry several; a moved tag leaves it with fewer).
	// A built-in image's tags are its build date (20260807) and latest.
	Tags []string `json:"tags,omitempty"`
	// Digest is an OCI image's manifest digest; IndexDigest the index it was chosen from.
	Digest      string    `json:"digest,omitempty"`
	IndexDigest string    `json:"index_digest,omitempty"`
	Source      string    `json:"source,omitempty"` // "built", "pull REF", "import FILE"
	Created     time.Time `json:"created,omitzero"` // the image config's creation time
	Config      *Config   `json:"config,omitempty"`
	Path        string    `json:"-"`
	// Format is the file's: "" for a raw ext4 image, "qcow2" for a build cache layer
	// (layers.go), which only builder sandboxes boot.
	Format string `json:"-"`
}

// Config is what an image's config says about running it: the defaults of nexus exec (an OCI
// image's config, or what a Dockerfile build set). It is the wire type, so it passes as is.
type Config = api.ImageConfig

// DateTag is the tag a built-in image's build carries besides latest.
func DateTag(built time.Time) string { return built.UTC().Format("20060102") }

// fill completes a record read from disk: the key and, for a built-in image, its tags.
func (i *Info) fill(key string) {
	if i.Key == "" {
		i.Key = key
	}
	if i.Digest == "" && i.Source == "" {
		i.Source = "built"
	}
	if i.Source == "built" {
		i.Tags = []string{DateTag(i.Built), "latest"}
		if i.Created.IsZero() {
			i.Created = i.Built
		}
	}
}

// checkName returns an invalid-argument error naming the known images.
func checkName(name string) error {
	for _, k := range Known {
		if name == k {
			return nil
		}
	}
	return errdefs.Invalid("unknown image %q: known images are %s", name, strings.Join(Known, ", "))
}

func imagePath(h home.Dir, name string) string    { return filepath.Join(h.Images(), name+".ext4") }
func manifestPath(h home.Dir, name string) string { return filepath.Join(h.Images(), name+".json") }

// Path returns the image file of an image, by reference or key (Resolve).
func Path(h home.Dir, ref string) (string, error) {
	info, err := Resolve(h, ref)
	if err != nil {
		return "", err
	}
	return info.Path, nil
}

// Get returns the manifest of a built image.
func Get(h home.Dir, name string) (*Info, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(manifestPath(h, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.NotFound("image %s is not built: run nexus image build %s", name, name)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("image %s: bad manifest: %w", name, err)
	}
	info.Path = imagePath(h, name)
	if _, err := os.Stat(info.Path); err != nil {
		return nil, errdefs.NotFound("image %s is not built: run nexus image build %s", name, name)
	}
	info.fill(name)
	return &info, nil
}

// List returns the built-in and OCI images, sorted by name and then newest first.
func List(h home.Dir) ([]Info, error) {
	var out []Info
	for _, n := range Known {
		info, err := Get(h, n)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *info)
	}
	oci, err := listOCI(h)
	if err != nil {
		return nil, err
	}
	out = append(out, oci...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Created.After(out[j].Created)
	})
	return out, nil
}

// Remove deletes a built image. Callers must make sure no sandbox overlay still uses it.
func Remove(h home.Dir, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	unlock, err := lock(context.Background(), h, name)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := Get(h, name); err != nil {
		return err
	}
	// Manifest first: an image without a manifest is "not built", never half-removed.
	if err := os.Remove(manifestPath(h, name)); err != nil {
		return fmt.Errorf("image rm %s: %w", name, err)
	}
	if err := os.Remove(imagePath(h, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("image rm %s: %w", name, err)
	}
	return nil
}

// Build builds the named image unless it is already built (force rebuilds). Downloads and a
// copy of the image go to the cache directory, where other homes sharing it find them.
func Build(ctx context.Context, h home.Dir, cache, name string, force bool, progress Progress) (*Info, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = func(string, float64) {}
	}
	if !force {
		if info, err := Get(h, name); err == nil {
			progress("cached", 1)
			return info, nil
		}
	}
	if err := os.MkdirAll(h.Images(), 0o755); err != nil {
		return nil, fmt.Errorf("image build %s: %w", name, err)
	}
	unlock, err := lock(ctx, h, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !force { // someone else built it while we waited
		if info, err := Get(h, name); err == nil {
			progress("cached", 1)
			return info, nil
		}
	}
	if !force {
		if info, err := fromCache(h, cache, name); err == nil {
			progress("cached", 1)
			return info, nil
		}
	}
	start := time.Now()
	work, err := os.MkdirTemp(h.Images(), "."+name+".build-")
	if err != nil {
		return nil, fmt.Errorf("image build %s: %w", name, err)
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")

	switch name {
	case Mini:
		err = buildMini(ctx, cache, root, progress)
	case Base:
		err = buildBase(ctx, cache, root, progress)
	case AgentBase:
		err = buildAgentBase(ctx, cache, root, progress)
	}
	if err != nil {
		return nil, err
	}
	progress("mkfs.ext4", 0.9)
	tmpImg := filepath.Join(work, name+".ext4")
	content, err := makeExt4(ctx, root, tmpImg, name)
	if err != nil {
		return nil, fmt.Errorf("image build %s: %w", name, err)
	}
	// The base stays read-only under every overlay.
	if err := os.Chmod(tmpImg, 0o444); err != nil {
		return nil, fmt.Errorf("image build %s: %w", name, err)
	}
	st, err := os.Stat(tmpImg)
	if err != nil {
		return nil, fmt.Errorf("image build %s: %w", name, err)
	}
	info := Info{
		Name: name, Built: time.Now().UTC(), Size: st.Size(), Content: content,
		BuildTime: time.Since(start).Seconds(), Key: name, Source: "built",
	}
	info.Created = info.Built
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		info.DiskUsage = sys.Blocks * 512
	}
	progress("install", 0.97)
	os.Remove(manifestPath(h, name)) // "not built" while the image file is swapped
	if err := os.Rename(tmpImg, imagePath(h, name)); err != nil {
		return nil, fmt.Errorf("image build %s: %w", name, err)
	}
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := atomicfile.WriteFile(manifestPath(h, name), b, 0o644); err != nil {
		return nil, fmt.Errorf("image build %s: %w", name, err)
	}
	toCache(h, cache, name, b)
	info.Path = imagePath(h, name)
	info.fill(name)
	progress("done", 1)
	return &info, nil
}

// lock takes the per-image build lock.
func lock(ctx context.Context, h home.Dir, name string) (func(), error) {
	if err := os.MkdirAll(h.Images(), 0o755); err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	f, err := os.OpenFile(filepath.Join(h.Images(), "."+name+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("image %s: lock: %w", name, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("image %s: lock: %w", name, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("image %s: waiting for another build: %w", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Recipe names the content of each image; change it when a build step changes so cached
// copies of the old content are not reused.
var Recipe = map[string]string{Mini: "mini-2", Base: "base-bookworm-2", AgentBase: "agent-base-bookworm-2"}

func cachedPath(cache, name string) string {
	stem := Recipe[name]
	if stem == "" { // an OCI image: its key names its content
		stem = name
	}
	return filepath.Join(cache, "images", stem+".ext4")
}

// toCache keeps a built image in the download cache, where other homes that share the cache
// (tests, CI, a second installation) find it. Images are never written in place, so a hard
// link is safe; across file systems it is copied.
func toCache(h home.Dir, cache, name string, manifest []byte) {
	dst := cachedPath(cache, name)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return
	}
	tmp := dst + ".tmp"
	os.Remove(tmp)
	if err := linkOrCopy(imagePath(h, name), tmp); err != nil {
		return
	}
	if atomicfile.WriteFile(strings.TrimSuffix(dst, ".ext4")+".json", manifest, 0o644) == nil {
		os.Rename(tmp, dst)
	}
}

// fromCache installs a cached image into h.
func fromCache(h home.Dir, cache, name string) (*Info, error) {
	src := cachedPath(cache, name)
	b, err := os.ReadFile(strings.TrimSuffix(src, ".ext4") + ".json")
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(src); err != nil {
		return nil, err
	}
	tmp := imagePath(h, name) + ".tmp"
	os.Remove(tmp)
	if err := linkOrCopy(src, tmp); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, imagePath(h, name)); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(manifestPath(h, name), b, 0o644); err != nil {
		return nil, err
	}
	return Resolve(h, name)
}

func linkOrCopy(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	out, err := exec.Command("cp", "--sparse=always", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("cp %s: %v: %s", src, err, out)
	}
	return nil
}
