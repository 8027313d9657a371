// Package kernel fetches and caches the guest kernel: Debian's linux-image-amd64, downloaded once
// with `apt-get download`, unpacked with `dpkg-deb -x` and indexed with `depmod -b` (DESIGN §4).
//
// Layout under <cacheDir>/kernel:
//
//	.lock               flock serialising fetches between processes
//	debs/               the downloaded .deb files
//	<version>/          the unpacked package (boot/vmlinuz-<version>, lib/modules/<version>/…)
//	current.json        {"version": "<version>"}: which unpacked tree Ensure returns
//
// A tree is unpacked into a temp dir and renamed into place; current.json is written after the
// rename, so a crash never leaves a half-unpacked kernel that Ensure would return.
package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// MetaPackage is the Debian metapackage whose dependency names the real kernel package.
const MetaPackage = "linux-image-amd64"

// Progress receives named steps and a completion fraction in [0,1]; it may be nil.
type Progress func(step string, frac float64)

// Kernel is an unpacked guest kernel.
type Kernel struct {
	Version     string // e.g. 6.1.0-57-amd64
	VmlinuzPath string // absolute path of the bootable image (bzImage)
	// VmlinuxPath is the uncompressed ELF kernel extracted from the bzImage, booted through its
	// PVH entry point: it skips decompression, which costs ~2 s under TCG. Empty when the
	// bzImage could not be unpacked; boot VmlinuzPath then.
	VmlinuxPath string
	ModulesDir  string // absolute path of lib/modules/<Version>, indexed by depmod
}

type current struct {
	Version string `json:"version"`
}

// versionRe bounds what we accept as a kernel version before using it in paths.
var versionRe = regexp.MustCompile(`^[0-9][0-9A-Za-z.+_-]{0,63}$`)

// Ensure returns the cached kernel under cacheDir, fetching and unpacking it first if needed.
// A cached kernel is returned without touching the network. Safe for concurrent use by several
// processes sharing cacheDir.
func Ensure(ctx context.Context, cacheDir string, progress Progress) (*Kernel, error) {
	if progress == nil {
		progress = func(string, float64) {}
	}
	root := filepath.Join(cacheDir, "kernel")
	if k, err := load(root); err == nil {
		return k, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	unlock, err := lock(ctx, filepath.Join(root, ".lock"))
	if err != nil {
		return nil, fmt.Errorf("kernel: lock cache: %w", err)
	}
	defer unlock()
	// Another process may have finished while we waited for the lock.
	if k, err := load(root); err == nil {
		return k, nil
	}
	return fetch(ctx, root, progress)
}

// load returns the kernel named by current.json if its files are all present.
func load(root string) (*Kernel, error) {
	b, err := os.ReadFile(filepath.Join(root, "current.json"))
	if err != nil {
		return nil, err
	}
	var c current
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("kernel: current.json: %w", err)
	}
	if !versionRe.MatchString(c.Version) {
		return nil, fmt.Errorf("kernel: current.json: bad version %q", c.Version)
	}
	k := &Kernel{
		Version:     c.Version,
		VmlinuzPath: filepath.Join(root, c.Version, "boot", "vmlinuz-"+c.Version),
		ModulesDir:  filepath.Join(root, c.Version, "lib", "modules", c.Version),
	}
	if _, err := os.Stat(filepath.Join(root, c.Version, "boot", "vmlinux")); err == nil {
		k.VmlinuxPath = filepath.Join(root, c.Version, "boot", "vmlinux")
	}
	for _, p := range []string{k.VmlinuzPath, filepath.Join(k.ModulesDir, "modules.dep"), filepath.Join(k.ModulesDir, "modules.builtin")} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("kernel: incomplete cache: %w", err)
		}
	}
	return k, nil
}

func fetch(ctx context.Context, root string, progress Progress) (*Kernel, error) {
	for _, tool := range []string{"apt-get", "dpkg-deb", "depmod"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, errdefs.Unavailable("kernel: %s not found: the guest kernel is fetched with apt-get download, dpkg-deb and depmod (Debian/Ubuntu packages apt, dpkg, kmod)", tool)
		}
	}
	debs := filepath.Join(root, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}

	progress("download "+MetaPackage, 0.05)
	meta, err := aptDownload(ctx, debs, MetaPackage)
	if err != nil {
		return nil, err
	}
	pkg, err := realPackage(ctx, meta)
	if err != nil {
		return nil, err
	}
	progress("download "+pkg, 0.15)
	deb, err := aptDownload(ctx, debs, pkg)
	if err != nil {
		return nil, err
	}

	progress("unpack "+pkg, 0.5)
	tmp, err := os.MkdirTemp(root, ".unpack-")
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := run(ctx, "", "dpkg-deb", "-x", deb, tmp); err != nil {
		return nil, fmt.Errorf("kernel: unpack %s: %w", filepath.Base(deb), err)
	}
	version, err := unpackedVersion(tmp)
	if err != nil {
		return nil, err
	}

	progress("depmod "+version, 0.85)
	if err := run(ctx, "", "depmod", "-b", tmp, version); err != nil {
		return nil, fmt.Errorf("kernel: depmod %s: %w", version, err)
	}

	progress("extract vmlinux", 0.9)
	// Best effort: a kernel we cannot unpack still boots as a bzImage, only slower.
	_ = extractVmlinux(ctx, filepath.Join(tmp, "boot", "vmlinuz-"+version), filepath.Join(tmp, "boot", "vmlinux"))

	dst := filepath.Join(root, version)
	if err := os.RemoveAll(dst); err != nil { // a stale tree without current.json pointing at it
		return nil, fmt.Errorf("kernel: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	b, _ := json.Marshal(current{Version: version})
	if err := atomicfile.WriteFile(filepath.Join(root, "current.json"), b, 0o644); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	progress("kernel ready", 1)
	return load(root)
}

// unpackedVersion finds the single lib/modules/<version> that has a matching boot/vmlinuz.
func unpackedVersion(dir string) (string, error) {
	ents, err := os.ReadDir(filepath.Join(dir, "lib", "modules"))
	if err != nil {
		return "", fmt.Errorf("kernel: unpacked package has no modules: %w", err)
	}
	for _, e := range ents {
		v := e.Name()
		if !e.IsDir() || !versionRe.MatchString(v) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "boot", "vmlinuz-"+v)); err == nil {
			return v, nil
		}
	}
	return "", errors.New("kernel: unpacked package has no boot/vmlinuz-<version> matching lib/modules/<version>")
}

// realPackage reads the metapackage's Depends and returns the linux-image-<version> it names.
func realPackage(ctx context.Context, metaDeb string) (string, error) {
	out, err := output(ctx, "dpkg-deb", "-f", metaDeb, "Depends")
	if err != nil {
		return "", fmt.Errorf("kernel: read %s depends: %w", MetaPackage, err)
	}
	for _, alt := range strings.FieldsFunc(string(out), func(r rune) bool { return r == ',' || r == '|' }) {
		name := strings.TrimSpace(alt)
		if i := strings.IndexAny(name, " ("); i >= 0 {
			name = name[:i]
		}
		if strings.HasPrefix(name, "linux-image-") && name != MetaPackage && pkgNameRe.MatchString(name) {
			return name, nil
		}
	}
	return "", fmt.Errorf("kernel: %s depends on no linux-image package: %q", MetaPackage, strings.TrimSpace(string(out)))
}

var pkgNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9.+-]{1,100}$`)

// aptDownload runs `apt-get download pkg` in dir and returns the path of the .deb it wrote.
// When apt has no package lists (a fresh container), it runs `apt-get update` once and retries.
func aptDownload(ctx context.Context, dir, pkg string) (string, error) {
	before := debsOf(dir, pkg)
	err := run(ctx, dir, "apt-get", "download", "-q", pkg)
	if err != nil && needsUpdate(err) {
		if uerr := run(ctx, "", "apt-get", "update", "-q"); uerr != nil {
			return "", fmt.Errorf("kernel: apt-get download %s: no package lists and apt-get update failed: %w", pkg, uerr)
		}
		err = run(ctx, dir, "apt-get", "download", "-q", pkg)
	}
	if err != nil {
		return "", fmt.Errorf("kernel: apt-get download %s: %w", pkg, err)
	}
	after := debsOf(dir, pkg)
	for _, p := range after {
		if !contains(before, p) {
			return p, nil
		}
	}
	if len(after) > 0 { // apt-get skipped an identical file already present
		return after[len(after)-1], nil
	}
	return "", fmt.Errorf("kernel: apt-get download %s wrote no .deb", pkg)
}

func needsUpdate(err error) bool {
	s := err.Error()
	return strings.Contains(s, "Unable to locate package") || strings.Contains(s, "has no installation candidate") ||
		strings.Contains(s, "No packages found")
}

func debsOf(dir, pkg string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	return m
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// run executes a tool in dir; its error carries the last line of stderr (one line, bounded).
func run(ctx context.Context, dir, name string, args ...string) error {
	_, err := runOut(ctx, dir, name, args...)
	return err
}

func output(ctx context.Context, name string, args ...string) ([]byte, error) {
	return runOut(ctx, "", name, args...)
}

func runOut(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", name, err, lastLine(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "W: ") {
			if len(l) > 300 {
				l = l[:300]
			}
			return l
		}
	}
	return ""
}

// lock takes an exclusive flock on path, giving up when ctx ends.
func lock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
