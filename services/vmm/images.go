package vmm

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/image"
)

// imageFile records, in a sandbox dir, which image its disk overlay is backed by.
const imageFile = "image"

// ensureImage returns the base image path, building a known image on first use so that
// `nexus create --image nexus-mini` works on a fresh machine.
func (s *Service) ensureImage(ctx context.Context, name, progress string) (string, error) {
	if p, err := image.Path(s.cfg.Home, name); err == nil {
		return p, nil
	}
	info, err := image.Build(ctx, s.cfg.Home, s.cfg.CacheDir, name, false, s.imageProgress(progress))
	if err != nil {
		return "", err
	}
	return info.Path, nil
}

func (s *Service) imageProgress(subject string) image.Progress {
	if subject == "" {
		return nil
	}
	return func(step string, frac float64) {
		b, _ := json.Marshal(api.ImageProgress{Step: step, Fraction: frac})
		s.cfg.Bus.Publish(subject, b)
	}
}

func (s *Service) images(ctx context.Context, _ api.Empty) ([]api.ImageInfo, error) {
	list, err := image.List(s.cfg.Home)
	if err != nil {
		return nil, err
	}
	out := []api.ImageInfo{}
	for _, i := range list {
		out = append(out, api.ImageInfo{Name: i.Name, Built: i.Built, SizeBytes: i.DiskUsage, Path: i.Path})
	}
	return out, nil
}

// image builds or removes an image. An image backing any sandbox disk is neither rebuilt nor
// removed: the sandboxes' overlays would silently change under them.
func (s *Service) image(ctx context.Context, r api.ImageRequest) (api.ImageInfo, error) {
	switch r.Op {
	case "build":
		if r.Force {
			if users := s.imageUsers(r.Name); len(users) > 0 {
				return api.ImageInfo{}, errdefs.Conflict("image %s backs the disks of %s: remove those sandboxes before rebuilding it", r.Name, strings.Join(users, ", "))
			}
		}
		info, err := image.Build(ctx, s.cfg.Home, s.cfg.CacheDir, r.Name, r.Force, s.imageProgress(r.Progress))
		if err != nil {
			return api.ImageInfo{}, err
		}
		return api.ImageInfo{Name: info.Name, Built: info.Built, SizeBytes: info.DiskUsage, Path: info.Path}, nil
	case "rm":
		if users := s.imageUsers(r.Name); len(users) > 0 {
			return api.ImageInfo{}, errdefs.Conflict("image %s backs the disks of %s: remove those sandboxes first", r.Name, strings.Join(users, ", "))
		}
		return api.ImageInfo{Name: r.Name}, image.Remove(s.cfg.Home, r.Name)
	}
	return api.ImageInfo{}, errdefs.Invalid("image: unknown operation %q", r.Op)
}

// imageUsers lists the sandbox ids whose disk is backed by the named image.
func (s *Service) imageUsers(name string) []string {
	files, _ := filepath.Glob(filepath.Join(s.cfg.Home.Sandboxes(), "*", imageFile))
	var out []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == name {
			out = append(out, filepath.Base(filepath.Dir(f)))
		}
	}
	return append(out, s.snapshotsOfImage(name)...)
}
