package image_test

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/IniZio/nexus/internal/ocitest"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/image"
)

// appImage is a three-layer image: a whiteout, a symlink, files owned by a user, a setuid
// binary, and a config with ENV/WORKDIR/USER/CMD/LABEL.
func appImage(t *testing.T, greeting string) v1.Image {
	base := ocitest.Tar(t,
		ocitest.File{Name: "etc/", Type: tar.TypeDir},
		ocitest.File{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/srv/app:/bin/sh\n"},
		ocitest.File{Name: "etc/group", Body: "root:x:0:\napp:x:1000:\n"},
		ocitest.File{Name: "etc/obsolete", Body: "to be whited out"},
		ocitest.File{Name: "usr/bin/", Type: tar.TypeDir},
		ocitest.File{Name: "usr/bin/su", Body: "not really su", Mode: 0o4755},
	)
	mid := ocitest.Tar(t,
		ocitest.File{Name: "etc/.wh.obsolete"},
		ocitest.File{Name: "bin", Type: tar.TypeSymlink, Link: "usr/bin"},
		ocitest.File{Name: "srv/app/", Type: tar.TypeDir, UID: 1000, GID: 1000, Mode: 0o750},
	)
	top := ocitest.Tar(t,
		ocitest.File{Name: "srv/app/hello", Body: greeting + "\n", UID: 1000, GID: 1000, Mode: 0o640},
		ocitest.File{Name: "srv/app/link", Type: tar.TypeSymlink, Link: "/srv/app/hello"},
	)
	return ocitest.Image(t, "amd64", v1.Config{
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=" + greeting},
		WorkingDir: "/srv/app", User: "app", Cmd: []string{"cat", "hello"},
		Labels: map[string]string{"org.example.team": "nexus"},
	}, ocitest.Layer(t, base), ocitest.Layer(t, mid), ocitest.Layer(t, top))
}

func debugfsStat(t *testing.T, img, p string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", `stat "`+p+`"`, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs stat %s: %v: %s", p, err, out)
	}
	return string(out)
}

var ownerRe = regexp.MustCompile(`User:\s+(\d+)\s+Group:\s+(\d+)`)
var modeRe = regexp.MustCompile(`Mode:\s+(\d+)`)

// owner returns "uid:gid mode" of a path in an ext4 image.
func owner(t *testing.T, img, p string) string {
	s := debugfsStat(t, img, p)
	o, m := ownerRe.FindStringSubmatch(s), modeRe.FindStringSubmatch(s)
	if o == nil || m == nil {
		t.Fatalf("debugfs stat %s: %s", p, s)
	}
	return o[1] + ":" + o[2] + " " + m[1]
}

// noPartial checks that nothing but finished images is left in the images directory.
func noPartial(t *testing.T, h home.Dir, want int) {
	t.Helper()
	ents, _ := os.ReadDir(h.Images())
	n := 0
	for _, e := range ents {
		switch {
		case strings.HasSuffix(e.Name(), ".lock"):
		case strings.HasPrefix(e.Name(), "sha256-") && strings.HasSuffix(e.Name(), ".json"):
			n++
		case strings.HasPrefix(e.Name(), "sha256-") && strings.HasSuffix(e.Name(), ".ext4"):
		default:
			t.Errorf("left in the images directory: %s", e.Name())
		}
	}
	if n != want {
		t.Errorf("%d images recorded, want %d", n, want)
	}
}

func pullEnv(t *testing.T) (home.Dir, string, context.Context) {
	needTools(t, "mkfs.ext4", "debugfs")
	h := tempHome(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return h, t.TempDir(), ctx
}

func TestPullTagDigestAndMovedTag(t *testing.T) {
	h, cache, ctx := pullEnv(t)
	reg := ocitest.NewRegistry(t)
	dig := reg.Push(t, "demo/app:1.2", appImage(t, "hi"))
	ref := reg.Host + "/demo/app:1.2"
	var layers []string
	info, err := image.Pull(ctx, h, cache, ref, image.PullOptions{Insecure: true,
		Layers: func(l string, done, total int64) { layers = append(layers, l) }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != reg.Host+"/demo/app" || !slices.Equal(info.Tags, []string{"1.2"}) || info.Digest != dig {
		t.Fatalf("record = %s %v %s, want %s/demo/app [1.2] %s", info.Name, info.Tags, info.Digest, reg.Host, dig)
	}
	if len(slices.Compact(layers)) < 3 {
		t.Errorf("progress named %d layers, want 3", len(slices.Compact(layers)))
	}
	c := info.Config
	if c == nil || c.WorkingDir != "/srv/app" || c.User != "app" || !slices.Equal(c.Cmd, []string{"cat", "hello"}) ||
		!slices.Contains(c.Env, "GREETING=hi") || c.Labels["org.example.team"] != "nexus" {
		t.Fatalf("config = %+v", c)
	}
	if got := owner(t, info.Path, "/srv/app/hello"); got != "1000:1000 0640" {
		t.Errorf("/srv/app/hello = %s, want 1000:1000 0640", got)
	}
	if got := owner(t, info.Path, "/srv/app"); got != "1000:1000 0750" {
		t.Errorf("/srv/app = %s, want 1000:1000 0750", got)
	}
	if got := owner(t, info.Path, "/usr/bin/su"); got != "0:0 04755" {
		t.Errorf("/usr/bin/su = %s, want 0:0 04755", got)
	}
	etc := debugfsLs(t, info.Path, "/etc")
	if hasEntry(etc, "obsolete") || !hasEntry(etc, "passwd") {
		t.Errorf("/etc after the whiteout:\n%s", etc)
	}
	if !strings.Contains(debugfsStat(t, info.Path, "/bin"), "Fast link dest: \"usr/bin\"") {
		t.Errorf("/bin is not the symlink to usr/bin")
	}

	for _, r := range []string{ref, reg.Host + "/demo/app@" + dig, info.Key} {
		got, err := image.Resolve(h, r)
		if err != nil || got.Key != info.Key {
			t.Errorf("Resolve(%s) = %v, %v; want %s", r, got, err, info.Key)
		}
	}
	_, err = image.Resolve(h, reg.Host+"/demo/app:bogus")
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "1.2") {
		t.Errorf("tag not here: %v, want not found listing 1.2", err)
	}
	if _, err := image.Pull(ctx, h, cache, reg.Host+"/demo/app:bogus", image.PullOptions{Insecure: true}, nil); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "no such image or tag") {
		t.Errorf("pull of a tag the registry lacks: %v", err)
	}

	// A second pull of the same digest fetches no blob.
	blobs := reg.BlobGets.Load()
	start := time.Now()
	if _, err := image.Pull(ctx, h, cache, ref, image.PullOptions{Insecure: true}, nil); err != nil {
		t.Fatal(err)
	}
	if reg.BlobGets.Load() != blobs {
		t.Errorf("second pull fetched %d blobs", reg.BlobGets.Load()-blobs)
	}
	t.Logf("second pull: %v", time.Since(start))

	// The tag moves: the old digest stays (without the tag) for what depends on it.
	dig2 := reg.Push(t, "demo/app:1.2", appImage(t, "hello again"))
	info2, err := image.Pull(ctx, h, cache, ref, image.PullOptions{Insecure: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info2.Digest != dig2 || info2.Key == info.Key {
		t.Fatalf("after the tag moved: %s, want %s", info2.Digest, dig2)
	}
	old, err := image.Resolve(h, info.Key)
	if err != nil || len(old.Tags) != 0 {
		t.Fatalf("old digest after the tag moved: %+v, %v; want kept, untagged", old, err)
	}
	if _, err := os.Stat(old.Path); err != nil {
		t.Fatal(err)
	}
	noPartial(t, h, 2)
	if err := image.RemoveRef(h, reg.Host+"/demo/app@"+dig); err != nil {
		t.Fatal(err)
	}
	noPartial(t, h, 1)
	list, _ := image.List(h)
	if len(list) != 1 || list[0].Digest != dig2 {
		t.Errorf("list after rm = %+v", list)
	}
}

func TestPullPlatform(t *testing.T) {
	h, cache, ctx := pullEnv(t)
	reg := ocitest.NewRegistry(t)
	l := ocitest.Layer(t, ocitest.Tar(t, ocitest.File{Name: "arch", Body: "amd64"}))
	amd := ocitest.Image(t, "amd64", v1.Config{}, l)
	arm := ocitest.Image(t, "arm64", v1.Config{}, ocitest.Layer(t, ocitest.Tar(t, ocitest.File{Name: "arch", Body: "arm64"})))
	idx := reg.PushIndex(t, "multi:1", map[string]v1.Image{"amd64": amd, "arm64": arm})
	info, err := image.Pull(ctx, h, cache, reg.Host+"/multi:1", image.PullOptions{Insecure: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	amdDigest, _ := amd.Digest()
	if info.Digest != amdDigest.String() || info.IndexDigest != idx {
		t.Errorf("pulled %s from index %s; want the amd64 image %s of %s", info.Digest, info.IndexDigest, amdDigest, idx)
	}
	if got, err := image.Resolve(h, reg.Host+"/multi@"+idx); err != nil || got.Key != info.Key {
		t.Errorf("by index digest: %v", err)
	}

	reg.PushIndex(t, "armonly:1", map[string]v1.Image{"arm64": arm})
	reg.Push(t, "arm:1", arm)
	for ref, want := range map[string]string{"armonly:1": "no linux/amd64 image (it has linux/arm64)", "arm:1": "is for linux/arm64"} {
		_, err := image.Pull(ctx, h, cache, reg.Host+"/"+ref, image.PullOptions{Insecure: true}, nil)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("pull %s: %v, want %q", ref, err, want)
		}
	}
	noPartial(t, h, 1)
}

func TestPullRefusesBadLayers(t *testing.T) {
	h, cache, ctx := pullEnv(t)
	reg := ocitest.NewRegistry(t)
	good := ocitest.Layer(t, ocitest.Tar(t, ocitest.File{Name: "ok", Body: "ok"}))
	// A config whose diff id is not the layer's: the content is not what the image says.
	img := ocitest.Image(t, "amd64", v1.Config{}, good)
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	corrupt, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	reg.Push(t, "bad:corrupt", corrupt)
	reg.Push(t, "bad:traversal", ocitest.Image(t, "amd64", v1.Config{}, good,
		ocitest.Layer(t, ocitest.Tar(t, ocitest.File{Name: "../../etc/cron.d/x", Body: "* * * * * root sh"}))))
	reg.Push(t, "bad:big", ocitest.Image(t, "amd64", v1.Config{}, ocitest.Layer(t, ocitest.Tar(t, ocitest.File{Name: "big", Body: strings.Repeat("z", 4096)}))))
	for tag, want := range map[string]string{"corrupt": "corrupt layer", "traversal": "path traversal", "big": "raise --max-size"} {
		_, err := image.Pull(ctx, h, cache, reg.Host+"/bad:"+tag, image.PullOptions{Insecure: true, MaxBytes: 1024}, nil)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("pull bad:%s: %v, want one line with %q", tag, err, want)
		}
	}
	noPartial(t, h, 0)
}

func TestImportDockerSave(t *testing.T) {
	h, cache, ctx := pullEnv(t)
	img := appImage(t, "hi")
	tarPath := filepath.Join(t.TempDir(), "app.tar")
	ocitest.Save(t, tarPath, "example.com/demo/app:1.2", img)
	info, err := image.Import(ctx, h, cache, tarPath, "", image.PullOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "example.com/demo/app" || !slices.Equal(info.Tags, []string{"1.2"}) || info.Config.User != "app" {
		t.Fatalf("imported %+v", info)
	}
	for p, want := range map[string]string{"/srv/app/hello": "1000:1000 0640", "/usr/bin/su": "0:0 04755", "/srv/app": "1000:1000 0750"} {
		if got := owner(t, info.Path, p); got != want {
			t.Errorf("%s = %s, want %s", p, got, want)
		}
	}
	if hasEntry(debugfsLs(t, info.Path, "/etc"), "obsolete") {
		t.Error("whiteout not applied on import")
	}
	// The same image pulled from a registry has the same root: names, types, modes, owners, sizes.
	reg := ocitest.NewRegistry(t)
	reg.Push(t, "demo/app:1.2", img)
	pulled, err := image.Pull(ctx, h, cache, reg.Host+"/demo/app:1.2", image.PullOptions{Insecure: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"/", "/etc", "/srv/app", "/usr/bin"} {
		if a, b := lsParseable(t, info.Path, dir), lsParseable(t, pulled.Path, dir); a != b || a == "" {
			t.Errorf("%s differs between import and pull:\n%s\nvs\n%s", dir, a, b)
		}
	}
	image.RemoveRef(h, pulled.Key)
	// A name given on the command line wins; a truncated tarball is refused, leaving nothing.
	if info, err := image.Import(ctx, h, cache, tarPath, "mine:dev", image.PullOptions{}, nil); err != nil || info.Name != "mine" || !slices.Contains(info.Tags, "dev") {
		t.Fatalf("import as mine:dev: %+v, %v", info, err)
	}
	b, _ := os.ReadFile(tarPath)
	trunc := filepath.Join(t.TempDir(), "trunc.tar")
	os.WriteFile(trunc, b[:len(b)*2/3], 0o644)
	if _, err := image.Import(ctx, h, cache, trunc, "trunc:1", image.PullOptions{}, nil); err == nil || strings.Contains(err.Error(), "\n") {
		t.Errorf("truncated import: %v, want a one-line error", err)
	}
	noPartial(t, h, 1)
}

// lsParseable lists a directory of an ext4 image as mode/uid/gid/name/size, without inode numbers.
func lsParseable(t *testing.T, img, dir string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", `ls -p "`+dir+`"`, img).Output()
	if err != nil {
		t.Fatalf("debugfs ls -p %s: %v", dir, err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Split(strings.Trim(l, "/"), "/")
		if len(f) < 6 || f[4] == "lost+found" {
			continue
		}
		lines = append(lines, strings.Join(f[1:], "/"))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// TestSaveRoundTrip: an image saved as a docker save tarball imports back to the same root
// (names, types, modes, owners, sizes, the setuid bit, a hard link) and the same config.
func TestSaveRoundTrip(t *testing.T) {
	h, cache, ctx := pullEnv(t)
	img, err := mutate.AppendLayers(appImage(t, "round"), ocitest.Layer(t, ocitest.Tar(t,
		ocitest.File{Name: "srv/app/hard", Type: tar.TypeLink, Link: "srv/app/hello"})))
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "app.tar")
	ocitest.Save(t, tarPath, "example.com/demo/app:1.2", img)
	orig, err := image.Import(ctx, h, cache, tarPath, "", image.PullOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(t.TempDir(), "saved.tar")
	if _, err := image.Export(ctx, h, "example.com/demo/app:1.2", saved, nil); err != nil {
		t.Fatal(err)
	}
	back, err := image.Import(ctx, h, cache, saved, "again:1", image.PullOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if back.Key == orig.Key || back.Config.User != "app" || back.Config.WorkingDir != "/srv/app" ||
		!slices.Equal(back.Config.Cmd, orig.Config.Cmd) || back.Config.Labels["org.example.team"] != "nexus" {
		t.Errorf("imported back %+v (config %+v)", back, back.Config)
	}
	for _, dir := range []string{"/", "/etc", "/srv/app", "/usr/bin"} {
		if a, b := lsParseable(t, orig.Path, dir), lsParseable(t, back.Path, dir); a != b || a == "" {
			t.Errorf("%s differs after save and import:\n%s\nvs\n%s", dir, a, b)
		}
	}
	if !strings.Contains(debugfsStat(t, back.Path, "/srv/app/hard"), "Links: 2") {
		t.Error("the hard link became a copy")
	}
	if _, err := image.Export(ctx, h, "nothere:1", saved, nil); err == nil {
		t.Error("saving an unknown image worked")
	}
}
