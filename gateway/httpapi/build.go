package httpapi

import (
	"archive/tar"
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// DockerBuild is a Dockerfile build sent to the API (`POST /v1/builds/{image}`), its context
// unpacked into the directory Context: what `nexus image build -f` is given.
type DockerBuild struct {
	Tag        string
	Context    string            // a directory of the API host, removed after the build
	File       string            // the Dockerfile, relative to Context
	BuildArgs  map[string]string // ARG values; they are never on a command line
	AllowHosts []string
	MemoryMiB  int
	NoCache    bool
}

// Bounds on an uploaded build context (untrusted input), as the CLI's for a directory.
const (
	maxBuildContext = 1 << 30
	maxBuildFiles   = 1 << 17
)

var buildArgName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// dockerBuild unpacks the uploaded tar into a temporary directory and runs the build there.
func dockerBuild(s *Service, w http.ResponseWriter, r *http.Request) error {
	if s.cfg.Build == nil {
		return errdefs.Unavailable("api: this server cannot run Dockerfile builds")
	}
	q := r.URL.Query()
	b := DockerBuild{Tag: r.PathValue("image"), File: q.Get("file"), AllowHosts: q["allow_host"], BuildArgs: map[string]string{}}
	if b.File == "" {
		b.File = "Dockerfile"
	}
	if f := path.Clean(b.File); f != b.File || path.IsAbs(f) || f == ".." || strings.HasPrefix(f, "../") {
		return errdefs.Invalid("file %q: give the Dockerfile's path inside the context, like Dockerfile or docker/app.Dockerfile", clip(b.File))
	}
	for _, a := range q["build_arg"] {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !buildArgName.MatchString(k) {
			return errdefs.Invalid("build_arg %q: give NAME=VALUE", clip(a))
		}
		b.BuildArgs[k] = v
	}
	if v := q.Get("memory_mib"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return errdefs.Invalid("invalid memory_mib %q", clip(v))
		}
		b.MemoryMiB = n
	}
	var err error
	if b.NoCache, err = boolQuery(r, "no_cache", false); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "nexus-build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := unpackContext(http.MaxBytesReader(w, r.Body, maxBuildContext+1<<20), dir); err != nil {
		return err
	}
	b.Context = dir
	ctx, cancel := withTimeout(r, api.ImageTimeout+api.CreateTimeout)
	defer cancel()
	info, err := s.cfg.Build(ctx, b)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

// unpackContext writes a tar archive's directories, regular files and symbolic links under
// dir, through an os.Root so that no entry (nor a link an earlier one made) lands outside it.
func unpackContext(body io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	bad := func(format string, a ...any) error {
		return errdefs.Invalid("build context: "+format, a...)
	}
	tr := tar.NewReader(body)
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return bad("larger than %d MiB", maxBuildContext>>20)
		}
		if err != nil {
			return bad("not a tar archive: %v", err)
		}
		if n >= maxBuildFiles {
			return bad("more than %d entries", maxBuildFiles)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") || strings.ContainsAny(name, "\x00\n\r") {
			return bad("%q is not a path inside the context", clip(h.Name))
		}
		if name == "." {
			continue
		}
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return bad("%s: %v", clip(name), err)
			}
		}
		mode := os.FileMode(h.Mode) & 0o777
		switch h.Typeflag {
		case tar.TypeDir:
			err = root.MkdirAll(name, 0o755)
			if err == nil {
				err = root.Chmod(name, mode|0o700)
			}
		case tar.TypeReg:
			if total += h.Size; total > maxBuildContext {
				return bad("larger than %d MiB", maxBuildContext>>20)
			}
			var f *os.File
			if f, err = root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode|0o600); err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		case tar.TypeSymlink:
			err = root.Symlink(h.Linkname, name)
		default:
			continue // hard links, devices, fifos: not part of a build context
		}
		if errors.As(err, new(*http.MaxBytesError)) {
			return bad("larger than %d MiB", maxBuildContext>>20)
		}
		if err != nil {
			return bad("%s: %v", clip(name), err)
		}
	}
}
