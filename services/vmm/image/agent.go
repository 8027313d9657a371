package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// AgentPackages are the Debian packages nexus-agent-base adds to nexus-base.
var AgentPackages = []string{"nodejs", "npm"}

// AgentNPMPackages are installed globally (npm install -g) into nexus-agent-base from the npm
// registry at build time.
var AgentNPMPackages = []string{"@anthropic-ai/claude-code"}

// ClaudePath is where the claude-code profile's launch command finds the agent.
const ClaudePath = "/usr/local/bin/claude"

// npmCacheInRoot is where the host's npm download cache is bind-mounted during the build.
const npmCacheInRoot = "/var/cache/nexus-npm"

// buildAgentBase is nexus-base plus Debian's nodejs and npm (apt-get in the root), then
// `npm install -g` of AgentNPMPackages run with the image's own npm inside the root (chroot). The chroot runs in a
// private mount namespace, so the bind mounts it needs (apt and npm caches under the download
// cache, /proc, /dev) exist only for the processes of the build and vanish with them: nothing is left
// mounted under the build directory, even when the build is killed.
func buildAgentBase(ctx context.Context, cache, root string, progress Progress) error {
	if err := needTools("chroot", "mount"); err != nil {
		return err
	}
	scaled := func(step string, frac float64) { progress(step, frac*0.5) }
	if err := debootstrap(ctx, cache, AgentBase, root, BasePackages, scaled); err != nil {
		return err
	}
	aptCache := filepath.Join(cache, "debs", "agent-apt")
	npmCache := filepath.Join(cache, "npm")
	for _, d := range []string{filepath.Join(aptCache, "partial"), npmCache, filepath.Join(root, npmCacheInRoot)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("image build %s: %w", AgentBase, err)
		}
	}
	binds := []bind{{aptCache, "/var/cache/apt/archives"}, {npmCache, npmCacheInRoot}}
	// The chroot resolves names with the host's resolver for the duration of the install only.
	resolv := filepath.Join(root, "etc", "resolv.conf")
	hostResolv, _ := os.ReadFile("/etc/resolv.conf")
	os.Remove(resolv)
	if err := os.WriteFile(resolv, hostResolv, 0o644); err != nil {
		return fmt.Errorf("image build %s: %w", AgentBase, err)
	}
	defer func() {
		os.Remove(resolv)
		os.WriteFile(resolv, nil, 0o644)
	}()

	// debootstrap's resolver cannot install npm's dependency tree; apt in the root can. The debs
	// stay in the download cache (the bind mount), so a rebuild fetches only the package lists.
	progress("apt-get install "+strings.Join(AgentPackages, " "), 0.5)
	aptInstall := "apt-get update -q && apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-unsafe-io " + strings.Join(AgentPackages, " ")
	if _, err := inChroot(ctx, root, binds, aptInstall); err != nil {
		return fmt.Errorf("image build %s: %w", AgentBase, err)
	}
	for _, glob := range []string{"var/lib/apt/lists/*_*", "var/cache/apt/*.bin", "var/log/apt/*", "var/log/dpkg.log"} {
		m, _ := filepath.Glob(filepath.Join(root, glob))
		for _, p := range m {
			os.RemoveAll(p)
		}
	}

	// npm fetches over TLS with the host's trust (a host behind a TLS-inspecting proxy trusts
	// its CA there); the bundle is copied in for the install and removed after it.
	caInRoot := "/tmp/nexus-build-ca.pem"
	if b, err := os.ReadFile(hostCABundle()); err == nil {
		if err := os.WriteFile(filepath.Join(root, caInRoot), b, 0o644); err != nil {
			return fmt.Errorf("image build %s: %w", AgentBase, err)
		}
		defer os.Remove(filepath.Join(root, caInRoot))
	} else {
		caInRoot = "/etc/ssl/certs/ca-certificates.crt" // the image's own store
	}
	progress("npm install -g "+strings.Join(AgentNPMPackages, " "), 0.65)
	install := "npm install -g --prefix /usr/local --no-audit --no-fund --no-update-notifier --loglevel=error --cache " + npmCacheInRoot +
		" --cafile " + caInRoot + " " + strings.Join(AgentNPMPackages, " ")
	if _, err := inChroot(ctx, root, binds, install); err != nil {
		return fmt.Errorf("image build %s: %w", AgentBase, err)
	}
	// The package's postinstall replaces a small stub with the native binary; a stub left in
	// place means the platform package did not install, and claude would not run.
	target, err := filepath.EvalSymlinks(filepath.Join(root, ClaudePath))
	if err != nil {
		return fmt.Errorf("image build %s: %s is missing after npm install: %w", AgentBase, ClaudePath, err)
	}
	if !strings.HasPrefix(target, root+"/") {
		return fmt.Errorf("image build %s: %s points outside the image root", AgentBase, ClaudePath)
	}
	if st, err := os.Stat(target); err != nil || st.Size() < 1<<20 {
		return fmt.Errorf("image build %s: %s is the npm package's stub, not the native agent (did its platform package install?)", AgentBase, ClaudePath)
	}
	progress("check claude --version", 0.85)
	out, err := inChroot(ctx, root, binds, ClaudePath+" --version")
	if err != nil {
		return fmt.Errorf("image build %s: %s --version: %w", AgentBase, ClaudePath, err)
	}
	progress("claude "+strings.TrimSpace(lastLine(string(out))), 0.87)
	// npm's per-user state is not part of the image.
	os.RemoveAll(filepath.Join(root, "root", ".npm"))
	os.RemoveAll(filepath.Join(root, "root", ".config"))
	return os.Remove(filepath.Join(root, npmCacheInRoot))
}

// hostCABundle is the host's CA bundle: $SSL_CERT_FILE, or Debian's system bundle.
func hostCABundle() string {
	if f := os.Getenv("SSL_CERT_FILE"); f != "" {
		if _, err := os.Stat(f); err == nil {
			return f
		}
	}
	return "/etc/ssl/certs/ca-certificates.crt"
}

// bind is a host directory mounted at a path inside the image root during the build.
type bind struct{ host, guest string }

// inChroot runs script with /bin/sh inside root, in a private mount namespace with binds, /proc
// and /dev mounted, and returns its stdout.
func inChroot(ctx context.Context, root string, binds []bind, script string) ([]byte, error) {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive",
		"ROOT=" + root, "SCRIPT=" + script,
	}
	setup := "set -e\n"
	for i, b := range binds {
		env = append(env, fmt.Sprintf("BIND_HOST_%d=%s", i, b.host), fmt.Sprintf("BIND_GUEST_%d=%s", i, b.guest))
		setup += fmt.Sprintf("mount --bind \"$BIND_HOST_%d\" \"$ROOT$BIND_GUEST_%d\"\n", i, i)
	}
	setup += `mount -t proc proc "$ROOT/proc"
mount --rbind /dev "$ROOT/dev"
exec chroot "$ROOT" /bin/sh -c "$SCRIPT"`
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", setup)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // Go makes / private in it
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", script, err, lastLine(stderr.String()))
	}
	return stdout.Bytes(), nil
}
