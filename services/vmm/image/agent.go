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

	"github.com/IniZio/nexus/pkg/home"
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

// buildAgentBase is nexus-base plus Debian's nodejs and npm, then `npm install -g` of
// AgentNPMPackages run with the image's own npm inside the root (chroot). The chroot runs in a
// private mount namespace, so the bind mounts it needs (the npm cache under the download cache,
// /proc, /dev) exist only for the processes of the build and vanish with them: nothing is left
// mounted under the build directory, even when the build is killed.
func buildAgentBase(ctx context.Context, h home.Dir, root string, progress Progress) error {
	if err := needTools("chroot", "mount"); err != nil {
		return err
	}
	scaled := func(step string, frac float64) { progress(step, frac*0.6) }
	packages := append(append([]string{}, BasePackages...), AgentPackages...)
	if err := debootstrap(ctx, h, AgentBase, root, packages, scaled); err != nil {
		return err
	}
	cache := filepath.Join(h.Cache(), "npm")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return fmt.Errorf("image build %s: %w", AgentBase, err)
	}
	if err := os.MkdirAll(filepath.Join(root, npmCacheInRoot), 0o755); err != nil {
		return fmt.Errorf("image build %s: %w", AgentBase, err)
	}
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

	progress("npm install -g "+strings.Join(AgentNPMPackages, " "), 0.62)
	install := "npm install -g --prefix /usr/local --no-audit --no-fund --no-update-notifier --loglevel=error --cache " + npmCacheInRoot + " " + strings.Join(AgentNPMPackages, " ")
	if _, err := inChroot(ctx, root, cache, install); err != nil {
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
	out, err := inChroot(ctx, root, cache, ClaudePath+" --version")
	if err != nil {
		return fmt.Errorf("image build %s: %s --version: %w", AgentBase, ClaudePath, err)
	}
	progress("claude "+strings.TrimSpace(lastLine(string(out))), 0.87)
	// npm's per-user state is not part of the image.
	os.RemoveAll(filepath.Join(root, "root", ".npm"))
	os.RemoveAll(filepath.Join(root, "root", ".config"))
	return os.Remove(filepath.Join(root, npmCacheInRoot))
}

// inChroot runs script with /bin/sh inside root, in a private mount namespace with the npm
// cache, /proc and /dev mounted, and returns its stdout.
func inChroot(ctx context.Context, root, npmCache, script string) ([]byte, error) {
	setup := `set -e
mount --bind "$NPM_CACHE" "$ROOT` + npmCacheInRoot + `"
mount -t proc proc "$ROOT/proc"
mount --rbind /dev "$ROOT/dev"
exec chroot "$ROOT" /bin/sh -c "$SCRIPT"`
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", setup)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // Go makes / private in it
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive",
		"ROOT=" + root, "NPM_CACHE=" + npmCache, "SCRIPT=" + script,
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", script, err, lastLine(stderr.String()))
	}
	return stdout.Bytes(), nil
}
