package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// Ref is a parsed image reference: NAME[:TAG][@DIGEST]. Built-in and imported images have
// short names (nexus-base, myimg); a pulled image's name starts with its registry
// (ghcr.io/org/img, docker.io/library/alpine, 127.0.0.1:5000/x).
type Ref struct {
	Name   string
	Tag    string // "" when the reference names a digest or no tag (latest)
	Digest string // sha256:…
}

// String is the reference as the user would write it.
func (r Ref) String() string {
	s := r.Name
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest
	}
	return s
}

// Remote reports whether the reference names a registry, so it can be pulled on first use.
func (r Ref) Remote() bool { return hasRegistry(r.Name) }

func hasRegistry(n string) bool {
	first, _, ok := strings.Cut(n, "/")
	return ok && (strings.ContainsAny(first, ".:") || first == "localhost")
}

// ParseRef parses NAME[:TAG][@DIGEST]; registry names are normalized the way docker does
// (docker.io/alpine is docker.io/library/alpine). Short names must be lower case
// [a-z0-9._/-].
func ParseRef(s string) (Ref, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Ref{}, errdefs.Invalid("image: empty image name")
	}
	if len(s) > 512 {
		return Ref{}, errdefs.Invalid("image: name %.40q… is longer than 512 bytes", s)
	}
	if strings.Contains(s, "..") || strings.HasPrefix(s, "/") {
		return Ref{}, errdefs.Invalid("image %s: invalid name", s)
	}
	var r Ref
	rest := s
	if i := strings.Index(rest, "@"); i >= 0 {
		r.Digest = rest[i+1:]
		rest = rest[:i]
		if !validDigest(r.Digest) {
			return Ref{}, errdefs.Invalid("image %s: digest must be sha256: and 64 hex digits", s)
		}
	}
	if i := strings.LastIndex(rest, ":"); i > strings.LastIndex(rest, "/") {
		r.Tag = rest[i+1:]
		rest = rest[:i]
		if !validTag(r.Tag) {
			return Ref{}, errdefs.Invalid("image %s: invalid tag %q", s, r.Tag)
		}
	}
	r.Name = rest
	if hasRegistry(rest) || strings.HasPrefix(rest, "docker.io/") {
		repo, err := name.NewRepository(rest)
		if err != nil {
			return Ref{}, errdefs.Invalid("image %s: %v", s, err)
		}
		r.Name = displayRepo(repo)
		return r, nil
	}
	for _, c := range rest {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.ContainsRune("._/-", c)) {
			return Ref{}, errdefs.Invalid("image %s: names are lower-case letters, digits and . _ / -", s)
		}
	}
	if rest == "" || strings.Contains(rest, "..") || strings.HasPrefix(rest, "/") || strings.HasSuffix(rest, "/") {
		return Ref{}, errdefs.Invalid("image %s: invalid name", s)
	}
	return r, nil
}

// displayRepo names a registry repository as users write it: docker.io/library/alpine rather
// than go-containerregistry's index.docker.io/library/alpine.
func displayRepo(repo name.Repository) string {
	if repo.RegistryStr() == name.DefaultRegistry {
		return "docker.io/" + repo.RepositoryStr()
	}
	return repo.Name()
}

func validDigest(d string) bool {
	hex, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for _, c := range hex {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func validTag(t string) bool {
	if t == "" || len(t) > 128 || t[0] == '.' || t[0] == '-' {
		return false
	}
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// keyOf is the file stem of an OCI image with the given manifest digest.
func keyOf(digest string) string { return strings.Replace(digest, ":", "-", 1) }

// isKey reports whether s is an OCI image key (sha256-<64 hex>).
func isKey(s string) bool {
	d, ok := strings.CutPrefix(s, "sha256-")
	return ok && validDigest("sha256:"+d)
}

// Resolve finds a local image by reference (NAME[:TAG][@DIGEST]) or key. A tag the image does
// not have is refused with the tags it has; an image not here at all is NotFound.
func Resolve(h home.Dir, s string) (*Info, error) {
	if IsLayerKey(s) {
		return getLayer(h, s)
	}
	if isKey(s) {
		return getOCI(h, s)
	}
	r, err := ParseRef(s)
	if err != nil {
		return nil, err
	}
	if slices.Contains(Known, r.Name) {
		info, err := Get(h, r.Name)
		if err != nil {
			return nil, err
		}
		if r.Digest != "" {
			return nil, errdefs.Invalid("image %s: built-in images have no digest; use %s:%s", s, r.Name, info.Tags[0])
		}
		if r.Tag != "" && !slices.Contains(info.Tags, r.Tag) {
			return nil, errdefs.Invalid("image %s has no tag %q: its tags are %s", r.Name, r.Tag, strings.Join(info.Tags, ", "))
		}
		return info, nil
	}
	list, err := listOCI(h)
	if err != nil {
		return nil, err
	}
	var tags []string
	found := false
	for i := range list {
		info := &list[i]
		if info.Name != r.Name {
			continue
		}
		found = true
		tags = append(tags, info.Tags...)
		if r.Digest != "" {
			if (info.Digest == r.Digest || info.IndexDigest == r.Digest) && (r.Tag == "" || slices.Contains(info.Tags, r.Tag)) {
				return info, nil
			}
			continue
		}
		if slices.Contains(info.Tags, cmpTag(r.Tag)) {
			return info, nil
		}
	}
	if found && r.Digest == "" {
		if len(tags) == 0 {
			tags = []string{"none (refer to it by digest)"}
		}
		if r.Remote() { // the registry may have it: a pull (or create's pull on first use) says
			return nil, errdefs.NotFound("image %s has no tag %q here (its tags here are %s): run nexus image pull %s", r.Name, cmpTag(r.Tag), strings.Join(tags, ", "), s)
		}
		return nil, errdefs.Invalid("image %s has no tag %q: its tags are %s", r.Name, cmpTag(r.Tag), strings.Join(tags, ", "))
	}
	if !r.Remote() {
		return nil, errdefs.Invalid("unknown image %q: known images are %s, the images nexus image ls lists, or a registry image (ghcr.io/org/img:1.2)", s, strings.Join(Known, ", "))
	}
	return nil, errdefs.NotFound("image %s is not here: run nexus image pull %s", s, s)
}

func cmpTag(t string) string {
	if t == "" {
		return "latest"
	}
	return t
}

func getOCI(h home.Dir, key string) (*Info, error) {
	b, err := os.ReadFile(manifestPath(h, key))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.NotFound("image %s is not here", key)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", key, err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("image %s: bad manifest: %w", key, err)
	}
	info.Path = imagePath(h, key)
	if _, err := os.Stat(info.Path); err != nil {
		return nil, errdefs.NotFound("image %s is not here", key)
	}
	info.fill(key)
	return &info, nil
}

// listOCI returns the pulled and imported images.
func listOCI(h home.Dir) ([]Info, error) {
	files, _ := filepath.Glob(filepath.Join(h.Images(), "sha256-*.json"))
	var out []Info
	for _, f := range files {
		key := strings.TrimSuffix(filepath.Base(f), ".json")
		if !isKey(key) {
			continue
		}
		info, err := getOCI(h, key)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *info)
	}
	return out, nil
}
