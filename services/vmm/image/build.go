package image

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Suite is the Debian release both images come from.
const Suite = "bookworm"

// BasePackages are installed into nexus-base on top of minbase (gh: the GitHub CLI, working in
// the guest through the brokered GH_TOKEN placeholder). Change Recipe with this list.
var BasePackages = []string{"ca-certificates", "git", "curl", "openssh-client", "gh"}

// DefaultMirror is used when the host's apt sources name no Debian mirror for Suite.
const DefaultMirror = "http://deb.debian.org/debian"

func needTools(tools ...string) error {
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			return errdefs.Unavailable("image build: %s not found: install it (Debian packages: debootstrap, e2fsprogs, dpkg, apt)", t)
		}
	}
	return nil
}

// buildMini assembles a busybox root: /bin/busybox from Debian's busybox-static (downloaded
// into the cache once), one symlink per applet, and the few files a shell session needs.
func buildMini(ctx context.Context, cache, root string, progress Progress) error {
	if err := needTools("apt-get", "dpkg-deb", "mkfs.ext4"); err != nil {
		return err
	}
	progress("fetch busybox-static", 0.1)
	debs := filepath.Join(cache, "debs")
	deb, err := cachedDownload(ctx, debs, "busybox-static")
	if err != nil {
		return err
	}
	progress("unpack busybox-static", 0.3)
	x := filepath.Join(filepath.Dir(root), "busybox-static")
	if err := run(ctx, "", "dpkg-deb", "-x", deb, x); err != nil {
		return fmt.Errorf("image build %s: unpack busybox: %w", Mini, err)
	}
	bb := filepath.Join(x, "bin", "busybox")
	list, err := runOut(ctx, "", bb, "--list-full")
	if err != nil {
		return fmt.Errorf("image build %s: busybox --list-full: %w", Mini, err)
	}

	progress("assemble root", 0.5)
	dirs := []struct {
		p    string
		mode fs.FileMode
	}{
		{"bin", 0o755}, {"sbin", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755}, {"lib", 0o755},
		{"etc", 0o755}, {"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"run", 0o755},
		{"tmp", 0o777 | fs.ModeSticky}, {"var/tmp", 0o777 | fs.ModeSticky}, {"var/log", 0o755},
		{"root", 0o700}, {"home", 0o755}, {"mnt", 0o755}, {"workspace", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.p)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	if err := copyFile(bb, filepath.Join(root, "bin", "busybox"), 0o755); err != nil {
		return err
	}
	applet := regexp.MustCompile(`^[a-z0-9_./-]{1,64}$`)
	for _, l := range strings.Split(string(list), "\n") {
		l = strings.Trim(strings.TrimSpace(l), "/")
		if l == "" || l == "bin/busybox" || !applet.MatchString(l) || strings.Contains(l, "..") {
			continue
		}
		dst := filepath.Join(root, l)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", dst); err != nil && !os.IsExist(err) {
			return err
		}
	}
	// wget: Debian builds busybox-static without FEATURE_WGET_TIMEOUT, and busybox 1.35's wget
	// then still accepts -T N but stores N through a NULL pointer: every `wget -T …` segfaults
	// (rc 139). The applet link becomes a script that applies -T/--timeout with busybox timeout.
	if err := os.Remove(filepath.Join(root, "usr/bin/wget")); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/wget"), []byte(miniWget), 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"etc/passwd":      "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":       "root:x:0:\nnogroup:x:65534:\n",
		"etc/shadow":      "root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n",
		"etc/hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
		"etc/hostname":    "nexus\n",
		"etc/resolv.conf": "",
		"etc/os-release":  "NAME=\"nexus-mini\"\nID=nexus-mini\nPRETTY_NAME=\"nexus-mini (busybox)\"\n",
		"etc/profile":     "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nexport PS1='\\h:\\w\\$ '\n",
	}
	for p, c := range files {
		mode := fs.FileMode(0o644)
		if p == "etc/shadow" {
			mode = 0o640
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), mode); err != nil {
			return err
		}
	}
	return nil
}

// miniWget is nexus-mini's /usr/bin/wget: busybox wget with -T SEC, -TSEC, --timeout=SEC and
// --timeout SEC taken out and applied as a limit on the whole transfer (exit 4, as GNU wget's
// network failure, when it passes).
const miniWget = `#!/bin/sh
# nexus-mini: busybox wget, with -T/--timeout applied by busybox timeout (Debian's busybox-static
# has no wget timeout support and crashes on -T).
t=
n=$#
while [ "$n" -gt 0 ]; do
	a=$1
	shift
	n=$((n - 1))
	case $a in
	--)
		set -- "$@" "$a"
		while [ "$n" -gt 0 ]; do
			set -- "$@" "$1"
			shift
			n=$((n - 1))
		done
		break
		;;
	-T | --timeout)
		[ "$n" -gt 0 ] || { echo "wget: option $a requires an argument" >&2; exit 1; }
		t=$1
		shift
		n=$((n - 1))
		;;
	-T* | --timeout=*) t=${a#-T}; t=${t#--timeout=} ;;
	*) set -- "$@" "$a" ;;
	esac
done
case $t in
'' | 0) exec /bin/busybox wget "$@" ;;
*[!0-9]*) echo "wget: invalid timeout '$t': give whole seconds" >&2; exit 1 ;;
esac
/bin/busybox timeout "$t" /bin/busybox wget "$@"
rc=$?
if [ "$rc" -eq 143 ]; then
	echo "wget: timed out after ${t}s" >&2
	exit 4
fi
exit "$rc"
`

// buildBase runs debootstrap with its debs cached under the nexus cache.
func buildBase(ctx context.Context, cache, root string, progress Progress) error {
	return debootstrap(ctx, cache, Base, root, BasePackages, progress)
}

// debootstrap builds a minbase root with packages (and what they depend on) for image name.
func debootstrap(ctx context.Context, cache, name, root string, packages []string, progress Progress) error {
	if err := needTools("debootstrap", "mkfs.ext4"); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errdefs.Unavailable("image build %s needs root: debootstrap must run as root (nexus-mini does not)", name)
	}
	mirror := HostMirror()
	debs := filepath.Join(cache, "debs", "debootstrap")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return err
	}
	progress("debootstrap "+Suite+" from "+mirror, 0.05)
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase",
		"--include="+strings.Join(packages, ","), "--cache-dir="+debs,
		Suite, root, mirror)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("image build %s: debootstrap: %w", name, err)
	}
	// debootstrap's "I: …" lines become progress steps; the fraction follows its phases.
	phases := []struct {
		prefix string
		frac   float64
	}{
		{"I: Retrieving", 0.1}, {"I: Validating", 0.2}, {"I: Extracting", 0.35},
		{"I: Installing core", 0.45}, {"I: Unpacking", 0.55}, {"I: Configuring", 0.7}, {"I: Base system installed", 0.85},
	}
	frac := 0.05
	var last string
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		last = line
		for _, p := range phases {
			if strings.HasPrefix(line, p.prefix) && p.frac > frac {
				frac = p.frac
			}
		}
		if strings.HasPrefix(line, "I: ") {
			progress("debootstrap: "+strings.TrimPrefix(line, "I: "), frac)
		}
	}
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		msg := lastLine(stderr.String())
		if msg == "" {
			msg = last
		}
		return fmt.Errorf("image build %s: debootstrap: %w: %s", name, err, msg)
	}

	progress("configure root", 0.88)
	// Package caches and lists only cost space; the guest fetches fresh lists when it needs them.
	for _, glob := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*", "var/cache/apt/*.bin", "var/log/*.log"} {
		m, _ := filepath.Glob(filepath.Join(root, glob))
		for _, p := range m {
			os.Remove(p)
		}
	}
	files := map[string]string{
		"etc/apt/sources.list": fmt.Sprintf("deb %s %s main\n", mirror, Suite),
		"etc/hostname":         "nexus\n",
		"etc/resolv.conf":      "",
		"etc/hosts":            "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
	}
	for p, c := range files {
		dst := filepath.Join(root, p)
		os.Remove(dst) // resolv.conf may be a symlink or the host's copy
		if err := os.WriteFile(dst, []byte(c), 0o644); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(root, "workspace"), 0o755)
}

// HostMirror returns the host's Debian mirror for Suite from its apt sources (deb822
// debian.sources or one-line sources.list), or DefaultMirror.
func HostMirror() string {
	var files []string
	files = append(files, "/etc/apt/sources.list")
	m, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append(files, m...)
	m, _ = filepath.Glob("/etc/apt/sources.list.d/*.list")
	files = append(files, m...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if u := mirrorFrom(string(b)); u != "" {
			return u
		}
	}
	return DefaultMirror
}

var uriRe = regexp.MustCompile(`^https?://[A-Za-z0-9.:/_~+-]+$`)

// mirrorFrom finds a URI serving Suite itself (not -security or -updates) in sources text.
func mirrorFrom(text string) string {
	// deb822 stanzas.
	for _, stanza := range strings.Split(text, "\n\n") {
		fields := map[string]string{}
		for _, l := range strings.Split(stanza, "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && !strings.HasPrefix(strings.TrimSpace(l), "#") {
				fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		if !strings.Contains(" "+fields["types"]+" ", " deb ") {
			continue
		}
		if !containsWord(fields["suites"], Suite) {
			continue
		}
		for _, u := range strings.Fields(fields["uris"]) {
			if uriRe.MatchString(u) {
				return strings.TrimRight(u, "/")
			}
		}
	}
	// One-line format: deb [opts] URI SUITE COMPONENTS…
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 && f[1] == Suite && uriRe.MatchString(f[0]) {
			return strings.TrimRight(f[0], "/")
		}
	}
	return ""
}

func containsWord(list, w string) bool {
	for _, x := range strings.Fields(list) {
		if x == w {
			return true
		}
	}
	return false
}

// makeExt4 writes a sparse ext4 image of root sized content + max(content, 512 MiB) and returns
// the content size.
func makeExt4(ctx context.Context, root, img, label string) (int64, error) {
	var content, inodes int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			content += (info.Size() + 4095) &^ 4095
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	content += inodes * 256
	headroom := content
	if headroom < 512<<20 {
		headroom = 512 << 20
	}
	size := (content + headroom + (1<<20 - 1)) &^ (1<<20 - 1)
	f, err := os.Create(img)
	if err != nil {
		return 0, err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return 0, err
	}
	f.Close()
	if err := run(ctx, "", "mkfs.ext4", "-q", "-F", "-L", label, "-m", "0", "-E", "root_owner=0:0", "-d", root, img); err != nil {
		return 0, fmt.Errorf("mkfs.ext4: %w", err)
	}
	return content, nil
}

// NewOverlay creates a qcow2 overlay at path backed by base (a raw image), for one sandbox.
// QEMU opens the backing file read-only, so many sandboxes share one base.
func NewOverlay(base, path string) error { return NewOverlaySized(base, path, 0) }

// NewOverlaySized is NewOverlay with a virtual size of size bytes (0: the base's): the most the
// guest's disk can ever hold. A size below the base's is refused, it would cut its file system.
func NewOverlaySized(base, path string, size int64) error {
	if !filepath.IsAbs(base) {
		return errdefs.Invalid("overlay: base image path %q must be absolute", base)
	}
	if _, err := os.Stat(base); err != nil {
		return errdefs.NotFound("overlay: base image %s: %v", base, err)
	}
	if err := needTools("qemu-img"); err != nil {
		return err
	}
	format := "raw"
	if isQcow2(base) { // a build cache layer (layers.go)
		format = "qcow2"
	}
	args := []string{"create", "-q", "-f", "qcow2", "-F", format, "-b", base, path}
	if size > 0 && format == "raw" {
		fi, err := os.Stat(base)
		if err != nil {
			return err
		}
		if size < fi.Size() {
			return errdefs.Invalid("a %d MiB disk is smaller than the image's %d MiB file system: ask for at least that", size>>20, (fi.Size()+1<<20-1)>>20)
		}
		args = append(args, strconv.FormatInt(size, 10))
	}
	if err := run(context.Background(), "", "qemu-img", args...); err != nil {
		return fmt.Errorf("overlay %s: %w", path, err)
	}
	return nil
}

func isQcow2(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	_, err = io.ReadFull(f, magic[:])
	return err == nil && string(magic[:]) == "QFI\xfb"
}

// cachedDownload returns a cached <pkg>_*.deb from dir, or downloads it with apt-get download.
func cachedDownload(ctx context.Context, dir, pkg string) (string, error) {
	if m, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb")); len(m) > 0 {
		return m[len(m)-1], nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, ".download-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	err = run(ctx, tmp, "apt-get", "download", "-q", pkg)
	if err != nil && strings.Contains(err.Error(), "Unable to locate package") {
		if uerr := run(ctx, "", "apt-get", "update", "-q"); uerr == nil {
			err = run(ctx, tmp, "apt-get", "download", "-q", pkg)
		}
	}
	if err != nil {
		return "", fmt.Errorf("apt-get download %s: %w", pkg, err)
	}
	m, _ := filepath.Glob(filepath.Join(tmp, pkg+"_*.deb"))
	if len(m) != 1 {
		return "", fmt.Errorf("apt-get download %s wrote %d files", pkg, len(m))
	}
	dst := filepath.Join(dir, filepath.Base(m[0]))
	if err := os.Rename(m[0], dst); err != nil {
		return "", err
	}
	return dst, nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

func run(ctx context.Context, dir, name string, args ...string) error {
	_, err := runOut(ctx, dir, name, args...)
	return err
}

func runOut(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", filepath.Base(name), err, lastLine(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "W: ") {
			if len(l) > 300 {
				l = l[:300] + "…"
			}
			return l
		}
	}
	return ""
}
