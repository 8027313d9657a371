package image_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/image"
)

func tempHome(t *testing.T) home.Dir {
	t.Helper()
	d := t.TempDir()
	t.Setenv("HOME", d)
	t.Setenv("NEXUS_HOME", d)
	return home.Dir(d)
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

func debugfsLs(t *testing.T, img, dir string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "ls -l "+dir, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs: %v: %s", err, out)
	}
	return string(out)
}

// hasEntry reports whether a debugfs ls -l listing has an entry called name.
func hasEntry(ls, name string) bool {
	for _, l := range strings.Split(ls, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[len(f)-1] == name {
			return true
		}
	}
	return false
}

func TestUnknownName(t *testing.T) {
	h := tempHome(t)
	_, err := image.Build(context.Background(), h, testutil.CacheDir(), "nexus-huge", false, nil)
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("err = %v, want invalid", err)
	}
	for _, n := range image.Known {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not list %s", err, n)
		}
	}
	if _, err := image.Path(h, "x"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Path(x) = %v, want invalid", err)
	}
	if _, err := image.Path(h, image.Mini); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Path of an unbuilt image = %v, want not found", err)
	}
}

func TestMini(t *testing.T) {
	needTools(t, "apt-get", "dpkg-deb", "mkfs.ext4", "debugfs")
	h := tempHome(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Two concurrent builders: one builds, the other waits on the lock and reuses the result.
	var wg sync.WaitGroup
	infos := make([]*image.Info, 2)
	errs := make([]error, 2)
	var steps []string
	var mu sync.Mutex
	start := time.Now()
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], errs[i] = image.Build(ctx, h, testutil.CacheDir(), image.Mini, false, func(step string, frac float64) {
				mu.Lock()
				steps = append(steps, step)
				mu.Unlock()
			})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("nexus-mini built in %v: size %d MiB, on disk %d KiB, content %d KiB; steps %v",
		time.Since(start).Round(time.Millisecond), infos[0].Size>>20, infos[0].DiskUsage>>10, infos[0].Content>>10, steps)
	if infos[0].Built != infos[1].Built {
		t.Errorf("the two builders built twice: %v vs %v", infos[0].Built, infos[1].Built)
	}
	img, err := image.Path(h, image.Mini)
	if err != nil {
		t.Fatal(err)
	}
	if img != filepath.Join(h.Images(), "nexus-mini.ext4") {
		t.Errorf("path = %s", img)
	}
	ls := debugfsLs(t, img, "/bin")
	for _, want := range []string{"busybox", "sh", "ls"} {
		if !hasEntry(ls, want) {
			t.Errorf("/bin lacks %q:\n%s", want, ls)
		}
	}
	if etc := debugfsLs(t, img, "/etc"); !hasEntry(etc, "passwd") || !hasEntry(etc, "group") {
		t.Errorf("/etc lacks passwd/group:\n%s", etc)
	}
	if infos[0].DiskUsage >= infos[0].Size/4 {
		t.Errorf("image is not sparse: %d of %d bytes allocated", infos[0].DiskUsage, infos[0].Size)
	}
	st, _ := os.Stat(img)
	if st.Mode().Perm()&0o222 != 0 {
		t.Errorf("base image is writable: %v", st.Mode())
	}

	// Cached: no rebuild.
	again, err := image.Build(ctx, h, testutil.CacheDir(), image.Mini, false, nil)
	if err != nil || !again.Built.Equal(infos[0].Built) {
		t.Fatalf("second build rebuilt or failed: %v", err)
	}
	// Forced: rebuilt, busybox deb comes from the cache.
	forced, err := image.Build(ctx, h, testutil.CacheDir(), image.Mini, true, nil)
	if err != nil || !forced.Built.After(infos[0].Built) {
		t.Fatalf("forced build: %v", err)
	}
	list, err := image.List(h)
	if err != nil || len(list) != 1 || list[0].Name != image.Mini {
		t.Fatalf("list = %+v, %v", list, err)
	}

	// Overlay: a qcow2 over the read-only base.
	ov := filepath.Join(t.TempDir(), "root.qcow2")
	if err := image.NewOverlay(img, ov); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("qemu-img", "info", ov).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "backing file: "+img) || !strings.Contains(string(out), "backing file format: raw") {
		t.Fatalf("qemu-img info: %v\n%s", err, out)
	}

	if err := image.Remove(h, image.Mini); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("image file left after rm")
	}
	if err := image.Remove(h, image.Mini); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second rm = %v, want not found", err)
	}
	// Nothing else left in images/ but the lock file.
	ents, _ := os.ReadDir(h.Images())
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("left in images/: %s", e.Name())
		}
	}
}

func TestHostMirrorParse(t *testing.T) {
	// Exercised through HostMirror on this host; the value must be an http(s) URL.
	m := image.HostMirror()
	if !strings.HasPrefix(m, "http://") && !strings.HasPrefix(m, "https://") {
		t.Fatalf("mirror = %q", m)
	}
	t.Logf("host mirror: %s", m)
}

// TestAgentBase builds nexus-agent-base (debootstrap, then apt and npm in a chroot). The shared
// download cache keeps the debs and npm downloads across runs.
func TestAgentBase(t *testing.T) {
	if testing.Short() {
		t.Skip("nexus-agent-base takes minutes to build")
	}
	needTools(t, "debootstrap", "mkfs.ext4", "debugfs", "chroot")
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI builds nexus-agent-base: debootstrap and chroot need root")
		}
		t.Skip("debootstrap needs root")
	}
	// The shared download cache (testutil.CacheDir) keeps debs and npm downloads and the built image across runs.
	h := home.Dir(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	var steps []string
	info, err := image.Build(ctx, h, testutil.CacheDir(), image.AgentBase, true, func(step string, frac float64) { steps = append(steps, step) })
	if err != nil {
		if len(steps) > 5 {
			steps = steps[len(steps)-5:]
		}
		t.Fatalf("build: %v (last steps %q)", err, steps)
	}
	t.Logf("nexus-agent-base built in %v: size %d MiB, on disk %d MiB, content %d MiB",
		time.Since(start).Round(time.Second), info.Size>>20, info.DiskUsage>>20, info.Content>>20)
	var version string
	for _, s := range steps {
		if strings.HasPrefix(s, "claude ") {
			version = s
		}
	}
	if version == "" {
		t.Errorf("no claude --version step in %q", steps)
	}
	t.Logf("%s", version)
	if bin := debugfsLs(t, info.Path, "/usr/local/bin"); !hasEntry(bin, "claude") {
		t.Errorf("/usr/local/bin lacks claude:\n%s", bin)
	}
	bin := debugfsLs(t, info.Path, "/usr/bin")
	// nexus-agent-base is nexus-base's debootstrap (the same packages) plus Node.js and Claude
	// Code, so this build checks nexus-base's recipe too, without a second debootstrap.
	for _, want := range []string{"git", "curl", "ssh", "bash", "gh", "node", "npm"} {
		if !hasEntry(bin, want) {
			t.Errorf("/usr/bin lacks %q", want)
		}
	}
	if certs := debugfsLs(t, info.Path, "/etc/ssl/certs"); !hasEntry(certs, "ca-certificates.crt") {
		t.Errorf("no ca-certificates bundle")
	}
	// The build's bind mounts lived in a private namespace: nothing of it is mounted here.
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), h.Images()) {
		t.Errorf("a build mount is still visible:\n%s", mounts)
	}
	if npm := debugfsLs(t, info.Path, "/var/cache"); hasEntry(npm, "nexus-npm") {
		t.Errorf("the npm cache mount point is left in the image")
	}
}
