package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// CommitOptions name and describe an image made from a root file system (Commit).
type CommitOptions struct {
	Name, Tag string
	Digest    string // sha256:<hex>; the image's key derives from it
	Source    string // the record's Source: "build Dockerfile", "save SANDBOX"
	Config    *Config
}

// Commit records a new image. raw is an ext4 file the caller made for it (moved into place); or,
// when raw is empty, the new image shares the root of base (a build that only changed the
// config). An image with the digest already here is only tagged. Nothing is left under the
// image's name unless it all worked.
func Commit(ctx context.Context, h home.Dir, raw string, base *Info, o CommitOptions) (*Info, error) {
	if !validDigest(o.Digest) {
		return nil, errdefs.Invalid("image commit: bad digest %q", o.Digest)
	}
	r, err := ParseRef(o.Name)
	if err != nil {
		return nil, err
	}
	if r.Digest != "" {
		return nil, errdefs.Invalid("image %s: name a tag, not a digest", o.Name)
	}
	if err := checkName(r.Name); err == nil {
		return nil, errdefs.Invalid("image %s: %s is a built-in image's name; pick another", o.Name, r.Name)
	}
	if o.Tag == "" {
		o.Tag = cmpTag(r.Tag)
	}
	src := source{name: r.Name, tag: o.Tag, what: o.Source}
	key := keyOf(o.Digest)
	unlock, err := lock(ctx, h, key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := getOCI(h, key); err == nil {
		return retag(ctx, h, key, src)
	}
	dst := imagePath(h, key)
	if raw == "" {
		if base == nil {
			return nil, errdefs.Invalid("image commit %s: no root to commit", o.Name)
		}
		tmp := filepath.Join(h.Images(), "."+key+".commit")
		os.Remove(tmp)
		if err := linkOrCopy(base.Path, tmp); err != nil {
			return nil, fmt.Errorf("image %s: %w", o.Name, err)
		}
		raw = tmp
		defer os.Remove(tmp)
	}
	if err := os.Chmod(raw, 0o444); err != nil {
		return nil, fmt.Errorf("image %s: %w", o.Name, err)
	}
	st, err := os.Stat(raw)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", o.Name, err)
	}
	now := time.Now().UTC()
	info := Info{Name: r.Name, Built: now, Created: now, Size: st.Size(), Key: key, Digest: o.Digest, Source: o.Source, Config: o.Config}
	if base != nil {
		info.Content = base.Content
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		info.DiskUsage = sys.Blocks * 512
	}
	if err := os.Rename(raw, dst); err != nil {
		return nil, fmt.Errorf("image %s: %w", o.Name, err)
	}
	if err := writeRecord(h, &info); err != nil {
		os.Remove(dst)
		return nil, fmt.Errorf("image %s: %w", o.Name, err)
	}
	return retag(ctx, h, key, src)
}
