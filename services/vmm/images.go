package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/image"
)

// imageFile records, in a sandbox dir, which image its disk overlay is backed by: the image's
// key (the name of a built-in image, sha256-<hex> of an OCI one), never a tag that can move.
const imageFile = "image"

// ensureImage returns the base image of a reference, building a built-in image or pulling a
// registry one on first use so that `nexus create --image nexus-mini` (or ghcr.io/org/img:1.2)
// works on a fresh machine.
func (s *Service) ensureImage(ctx context.Context, ref, progress string) (*image.Info, error) {
	info, err := image.Resolve(s.cfg.Home, ref)
	if err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return info, err
	}
	r, perr := image.ParseRef(ref)
	if perr != nil {
		return nil, perr
	}
	if r.Remote() {
		return image.Pull(ctx, s.cfg.Home, s.cfg.CacheDir, ref, image.PullOptions{}, s.imageProgress(progress))
	}
	if r.Tag != "" && r.Tag != "latest" {
		return nil, errdefs.Invalid("image %s is not built, so it has no tag %q: its builds are tagged latest and their build date", r.Name, r.Tag)
	}
	return image.Build(ctx, s.cfg.Home, s.cfg.CacheDir, r.Name, false, s.imageProgress(progress))
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

// layerProgress publishes per-layer progress of a pull or import.
func (s *Service) layerProgress(subject string) image.LayerProgress {
	if subject == "" {
		return nil
	}
	return func(layer string, done, total int64) {
		b, _ := json.Marshal(api.ImageProgress{Step: "layer " + shortDigest(layer), Layer: layer, Done: done, Total: total})
		s.cfg.Bus.Publish(subject, b)
	}
}

func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

func imageInfo(i *image.Info) api.ImageInfo {
	out := api.ImageInfo{Name: i.Name, Tags: i.Tags, Digest: i.Digest, IndexDigest: i.IndexDigest, Key: i.Key,
		Source: i.Source, Created: i.Created, Built: i.Built, SizeBytes: i.DiskUsage, Path: i.Path}
	if out.Tags == nil {
		out.Tags = []string{}
	}
	if c := i.Config; c != nil {
		out.Env, out.WorkingDir, out.User, out.Entrypoint, out.Cmd, out.Labels = c.Env, c.WorkingDir, c.User, c.Entrypoint, c.Cmd, c.Labels
	}
	return out
}

func (s *Service) images(ctx context.Context, _ api.Empty) ([]api.ImageInfo, error) {
	list, err := image.List(s.cfg.Home)
	if err != nil {
		return nil, err
	}
	out := []api.ImageInfo{}
	for i := range list {
		out = append(out, imageInfo(&list[i]))
	}
	return out, nil
}

// image builds, pulls, imports, inspects or removes an image. An image backing any sandbox disk
// or snapshot is neither rebuilt nor removed: the sandboxes' overlays would silently change under
// them.
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
		return imageInfo(info), nil
	case "pull":
		info, err := image.Pull(ctx, s.cfg.Home, s.cfg.CacheDir, r.Name, s.pullOptions(r), s.imageProgress(r.Progress))
		if err != nil {
			return api.ImageInfo{}, err
		}
		return imageInfo(info), nil
	case "import":
		info, err := image.Import(ctx, s.cfg.Home, s.cfg.CacheDir, r.File, r.Name, s.pullOptions(r), s.imageProgress(r.Progress))
		if err != nil {
			return api.ImageInfo{}, err
		}
		return imageInfo(info), nil
	case "inspect":
		info, err := image.Resolve(s.cfg.Home, r.Name)
		if err != nil {
			return api.ImageInfo{}, err
		}
		out := imageInfo(info)
		out.UsedBy = s.imageUsers(info.Key)
		return out, nil
	case "rm":
		info, err := image.Resolve(s.cfg.Home, r.Name)
		if err != nil {
			return api.ImageInfo{}, err
		}
		if users := s.imageUsers(info.Key); len(users) > 0 {
			return api.ImageInfo{}, errdefs.Conflict("image %s backs the disks of %s: remove those first", r.Name, strings.Join(users, ", "))
		}
		if err := image.RemoveRef(s.cfg.Home, r.Name); err != nil {
			return api.ImageInfo{}, err
		}
		return imageInfo(info), nil
	}
	return api.ImageInfo{}, errdefs.Invalid("image: unknown operation %q", r.Op)
}

func (s *Service) pullOptions(r api.ImageRequest) image.PullOptions {
	return image.PullOptions{Username: r.Username, Password: r.Password, Insecure: r.Insecure,
		MaxBytes: r.MaxBytes, MaxInodes: r.MaxInodes, Layers: s.layerProgress(r.Progress)}
}

// imageUsers lists the sandbox ids whose disk is backed by the image with the given key, and the
// snapshots ("snapshot <name>") whose disks are.
func (s *Service) imageUsers(key string) []string {
	files, _ := filepath.Glob(filepath.Join(s.cfg.Home.Sandboxes(), "*", imageFile))
	var out []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == key {
			out = append(out, filepath.Base(filepath.Dir(f)))
		}
	}
	return append(out, s.snapshotsOfImage(key)...)
}

// imageConfig returns the config of the image a sandbox's disk is backed by, or nil (built-in
// images, or a record that is gone).
func (s *Service) imageConfig(dir string) *image.Config {
	b, err := os.ReadFile(filepath.Join(dir, imageFile))
	if err != nil {
		return nil
	}
	info, err := image.Resolve(s.cfg.Home, strings.TrimSpace(string(b)))
	if err != nil {
		return nil
	}
	return info.Config
}

// withImageEnv returns the sandbox's environment over the image config's Env: the sandbox's
// (and, per exec, the command's) variables win.
func withImageEnv(env map[string]string, c *image.Config) map[string]string {
	if c == nil || len(c.Env) == 0 {
		return env
	}
	out := map[string]string{}
	for _, kv := range c.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			out[k] = v
		}
	}
	for k, v := range env {
		out[k] = v
	}
	return out
}

// execDefaults fills what an exec left unsaid from the image config: the working directory, the
// user and, for an exec without a command, Entrypoint followed by Cmd (docker's precedence: what
// the caller gives always wins; a given command replaces both Entrypoint and Cmd, as in docker exec).
func execDefaults(r *api.ExecRequest, c *image.Config) {
	if c == nil {
		return
	}
	if r.Dir == "" {
		r.Dir = c.WorkingDir
	}
	if r.User == "" {
		r.User = c.User
	}
	if len(r.Argv) == 0 {
		r.Argv = append(append([]string{}, c.Entrypoint...), c.Cmd...)
	}
}
