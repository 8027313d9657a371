package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/stream"
	"github.com/IniZio/nexus/services/vmm/guest"
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

// progressSubject is where progress session id goes: its .out on this host ("" for none, or
// for anything that is not a session id: a caller never makes the vmm publish elsewhere).
func (s *Service) progressSubject(id string) string {
	if id == "" || stream.ValidID(id) != nil {
		return ""
	}
	return stream.OutSubject(s.cfg.Host, id)
}

func (s *Service) imageProgress(id string) image.Progress {
	subject := s.progressSubject(id)
	if subject == "" {
		return nil
	}
	return func(step string, frac float64) {
		b, _ := json.Marshal(api.ImageProgress{Step: step, Fraction: frac})
		s.cfg.Bus.Publish(subject, b)
	}
}

// layerProgress publishes per-layer progress of a pull or import.
func (s *Service) layerProgress(id string) image.LayerProgress {
	subject := s.progressSubject(id)
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
		out.ExposedPorts = c.ExposedPorts
	}
	return out
}

func (s *Service) images(ctx context.Context, _ api.Empty) ([]api.ImageInfo, error) {
	list, err := image.List(s.cfg.Home)
	if err != nil {
		return nil, err
	}
	tpls := s.listTemplates(ctx)
	out := []api.ImageInfo{}
	for i := range list {
		info := imageInfo(&list[i])
		for _, t := range tpls {
			if t.Image == info.Key {
				info.Templates = append(info.Templates, t)
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// image builds, pulls, imports, inspects, removes or warms (template.go) an image. An image backing any sandbox disk
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
		if r.SID != "" { // the archive comes over the caller's stream session (import -)
			file, err := s.receiveArchive(r)
			if err != nil {
				return api.ImageInfo{}, err
			}
			defer os.Remove(file)
			r.File = file
		}
		info, err := image.Import(ctx, s.cfg.Home, s.cfg.CacheDir, r.File, r.Name, s.pullOptions(r), s.imageProgress(r.Progress))
		if err != nil {
			return api.ImageInfo{}, err
		}
		return imageInfo(info), nil
	case "save":
		if !filepath.IsAbs(r.File) {
			return api.ImageInfo{}, errdefs.Invalid("image save: the file must be an absolute path on the vmm's host")
		}
		info, err := image.Export(ctx, s.cfg.Home, r.Name, r.File, s.imageProgress(r.Progress))
		if err != nil {
			return api.ImageInfo{}, err
		}
		return imageInfo(info), nil
	case "layer-save":
		info, err := s.saveLayer(ctx, r)
		if err != nil {
			return api.ImageInfo{}, err
		}
		return imageInfo(info), nil
	case "commit":
		info, err := s.commit(ctx, r)
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
		out.Templates = s.imageTemplates(ctx, info.Key)
		return out, nil
	case "warm":
		return s.warmImage(ctx, r)
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
		if _, err := image.Resolve(s.cfg.Home, info.Key); err != nil { // its last reference: its templates go too
			for _, t := range s.imageTemplates(ctx, info.Key) {
				s.removeTemplate(t.Key)
			}
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
		// A builder sandbox's disk may be backed by a build cache layer: it uses the layers
		// and the image under it too.
		if b, err := os.ReadFile(f); err == nil && slices.Contains(image.LayerChain(s.cfg.Home, strings.TrimSpace(string(b))), key) {
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

// commit makes an image of a stopped sandbox's disk (its qcow2 overlay flattened with its base
// into a new raw ext4, so the image depends on nothing), or of a base image's root under a new
// config. The digest comes from the build's cache key, else from the sandbox and the time.
func (s *Service) commit(ctx context.Context, r api.ImageRequest) (*image.Info, error) {
	key := r.BuildKey
	if key == "" {
		key = r.Sandbox + "@" + time.Now().UTC().Format(time.RFC3339Nano)
	}
	o := image.CommitOptions{Name: r.Name, Digest: api.BuildDigest(key), Source: r.Source, Config: r.Config}
	if o.Source == "" {
		o.Source = "commit " + r.Sandbox
	}
	if r.Sandbox == "" {
		base, err := image.Resolve(s.cfg.Home, r.Base)
		if err != nil {
			return nil, err
		}
		if base.Format == "" {
			return image.Commit(ctx, s.cfg.Home, "", base, o)
		}
		// A build cache layer: its root, read through its chain, becomes the image's own.
		work, err := os.MkdirTemp(s.cfg.Home.Images(), ".commit-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(work)
		raw := filepath.Join(work, "root.ext4")
		if err := image.Flatten(ctx, base, raw); err != nil {
			return nil, fmt.Errorf("image %s: %w", r.Name, err)
		}
		return image.Commit(ctx, s.cfg.Home, raw, nil, o)
	}
	defer s.lockID(r.Sandbox)()
	m, dir, disk := s.sandboxDisk(r.Sandbox)
	if _, err := os.Stat(disk); err != nil {
		return nil, errdefs.NotFound("sandbox %s has no disk to make an image of", r.Sandbox)
	}
	var base *image.Info
	if b, err := os.ReadFile(filepath.Join(dir, imageFile)); err == nil {
		base, _ = image.Resolve(s.cfg.Home, strings.TrimSpace(string(b)))
	}
	if err := os.MkdirAll(s.cfg.Home.Images(), 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(s.cfg.Home.Images(), ".commit-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	raw := filepath.Join(work, "root.ext4")
	if p := s.imageProgress(r.Progress); p != nil {
		p("flatten disk", 0.5)
	}
	argv := []string{"convert", "-q", "-f", "qcow2", "-O", "raw", disk, raw}
	if m != nil { // running: its writes flushed, then read while it is paused
		resume, err := s.quiesce(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", r.Name, err)
		}
		defer resume()
		argv = append([]string{"convert", "-U"}, argv[1:]...)
	}
	if out, err := exec.CommandContext(ctx, "qemu-img", argv...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("image %s: flattening the disk of %s: %v: %s", r.Name, r.Sandbox, err, errdefs.FirstLine(strings.TrimSpace(string(out))))
	}
	return image.Commit(ctx, s.cfg.Home, raw, base, o)
}

// sandboxDisk is sandbox id's running machine (nil when it is not running), its directory and
// its disk's path. The caller holds the sandbox's lock.
func (s *Service) sandboxDisk(id string) (m *machine, dir, disk string) {
	s.mu.Lock()
	m = s.vms[id]
	s.mu.Unlock()
	dir = s.cfg.Home.Sandbox(id)
	return m, dir, filepath.Join(dir, "disk.qcow2")
}

// saveLayer records a builder sandbox's disk as the build cache layer of the step it just ran
// (r.BuildKey): a running builder is flushed and paused for the copy, then resumes.
func (s *Service) saveLayer(ctx context.Context, r api.ImageRequest) (*image.Info, error) {
	key := image.LayerKey(r.BuildKey)
	if !image.IsLayerKey(key) {
		return nil, errdefs.Invalid("build cache: bad step key %q", r.BuildKey)
	}
	defer s.lockID(r.Sandbox)()
	m, dir, disk := s.sandboxDisk(r.Sandbox)
	parent, err := os.ReadFile(filepath.Join(dir, imageFile))
	if err != nil {
		return nil, errdefs.NotFound("sandbox %s has no disk to keep a layer of", r.Sandbox)
	}
	if m != nil {
		resume, err := s.quiesce(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("build cache: %w", err)
		}
		defer resume()
	}
	return image.SaveLayer(ctx, s.cfg.Home, key, disk, strings.TrimSpace(string(parent)), s.cfg.BuildCacheBytes,
		func(k string) bool { return len(s.imageUsers(k)) > 0 })
}

// quiesce makes a running sandbox's disk consistent for a copy: the guest's dirty pages are
// written (sync), then the VM is paused, which drains and flushes QEMU's block layer. The
// returned func resumes the VM and sets the guest clock that stood still.
func (s *Service) quiesce(ctx context.Context, m *machine) (func(), error) {
	if m.agent == nil {
		return nil, errdefs.Conflict("sandbox %s has no agent to flush its disk: stop it first", m.name)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	// The agent's own sync, which every image has; an agent from before it had one, the image's.
	st, err := m.agent.Exec(sctx, guest.ExecRequest{Argv: []string{agentproto.GuestBinDir + "/nexus-agent", "sync"}, User: "root"}, nil, io.Discard, io.Discard, nil)
	if err == nil && st.Code != 0 {
		st, err = m.agent.Exec(sctx, guest.ExecRequest{Argv: []string{"sync"}, User: "root"}, nil, io.Discard, io.Discard, nil)
	}
	cancel()
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("sync exited %d %s", st.Code, st.Error)
	}
	if err != nil {
		return nil, fmt.Errorf("flushing the guest's writes: %w", err)
	}
	if err := m.vm.Pause(ctx); err != nil {
		return nil, fmt.Errorf("pausing the VM: %w", err)
	}
	return func() {
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.vm.Resume(rctx); err != nil {
			s.log.Warn().Err(err).Str("sandbox", m.name).Msg("resuming after an image commit")
			return
		}
		now := time.Now()
		m.agent.Configure(rctx, agentproto.ConfigureRequest{Time: &now})
	}, nil
}

// receiveArchive writes the archive the caller streams on session r.SID into a file of the
// images directory, which the caller removes. It says "ready" first, so nothing is sent before
// this side listens; the archive is bounded like what it unpacks to.
func (s *Service) receiveArchive(r api.ImageRequest) (string, error) {
	limit := r.MaxBytes
	if limit <= 0 {
		limit = image.DefaultMaxBytes
	}
	if err := os.MkdirAll(s.cfg.Home.Images(), 0o755); err != nil {
		return "", err
	}
	sess, err := stream.Server(s.cfg.Bus, s.cfg.Host, r.SID)
	if err != nil {
		return "", err
	}
	defer sess.Close()
	f, err := os.CreateTemp(s.cfg.Home.Images(), ".import-*.tar")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		f.Close()
		os.Remove(f.Name())
		return "", err
	}
	if err := sess.Write(stream.KindStdout, []byte("ready")); err != nil {
		return fail(err)
	}
	var n int64
	for {
		m, err := sess.Recv()
		if err != nil {
			return fail(fmt.Errorf("image import: the archive stream ended early: %w", err))
		}
		switch m.Kind {
		case stream.KindStdin:
			if n += int64(len(m.Data)); n > limit {
				return fail(errdefs.Invalid("image import: the archive is larger than %d MiB (--max-size raises it)", limit>>20))
			}
			if _, err := f.Write(m.Data); err != nil {
				return fail(fmt.Errorf("image import: %w", err))
			}
		case stream.KindStdinClose:
			if err := f.Close(); err != nil {
				os.Remove(f.Name())
				return "", fmt.Errorf("image import: %w", err)
			}
			return f.Name(), nil
		}
	}
}

// runsAsRoot says whether an image's commands run as root in the guest (its config names no
// other user).
func runsAsRoot(c *image.Config) bool {
	if c == nil {
		return true
	}
	u, _, _ := strings.Cut(c.User, ":")
	return u == "" || u == "root" || u == "0"
}
