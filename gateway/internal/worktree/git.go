package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Host git. A delegation's worktree, its index and its branch ref are written by an untrusted
// guest, so every git command the host runs on them reads its configuration only from the host
// repository, never from a guest-writable git dir (a planted core.fsmonitor or filter would run
// on the host), and never runs hooks.

// gitTimeout bounds one host git command.
const gitTimeout = time.Minute

// safeGitConfig is passed to every git command that looks at guest-written data.
var safeGitConfig = []string{
	"-c", "core.fsmonitor=false",
	"-c", "core.hooksPath=/dev/null",
	"-c", "core.untrackedCache=false",
	"-c", "diff.ignoreSubmodules=all",
	"-c", "status.showUntrackedFiles=all",
}

// runGit runs git with args and extra environment; stderr's last line becomes the error.
func runGit(ctx context.Context, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, gitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_PAGER=cat", "GIT_OPTIONAL_LOCKS=0", "LC_ALL=C")
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &limitWriter{w: &stdout, n: 4 << 20}
	cmd.Stderr = &limitWriter{w: &stderr, n: 64 << 10}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		if msg == "" {
			msg = err.Error()
		}
		return stdout.String(), fmt.Errorf("git %s: %s", args[0], strings.TrimPrefix(msg, "fatal: "))
	}
	return stdout.String(), nil
}

type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// Repo is what delegation needs of a host repository.
type Repo struct {
	Top       string // the main worktree
	CommonDir string // its git dir (.git)
}

// Inspect checks that path is a git repository with a work tree.
func Inspect(ctx context.Context, path string) (Repo, error) {
	if !filepath.IsAbs(path) {
		return Repo{}, errdefs.Invalid("repo_path %q must be an absolute path", path)
	}
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		return Repo{}, errdefs.Invalid("repo_path %s is not a directory", path)
	}
	out, err := runGit(ctx, nil, "-C", path, "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-common-dir")
	if err != nil {
		return Repo{}, errdefs.Invalid("repo_path %s is not a git repository with a work tree", path)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		return Repo{}, errdefs.Invalid("repo_path %s is not a git repository with a work tree", path)
	}
	r := Repo{Top: lines[0], CommonDir: lines[1]}
	if v, _ := runGit(ctx, nil, "--git-dir="+r.CommonDir, "config", "--get", "extensions.refstorage"); strings.TrimSpace(v) != "" && strings.TrimSpace(v) != "files" {
		return Repo{}, errdefs.Invalid("repo_path %s uses the %s ref storage; delegation needs the files backend", path, strings.TrimSpace(v))
	}
	for _, p := range []string{r.Top, r.CommonDir} {
		if strings.ContainsAny(p, ":\n") {
			return Repo{}, errdefs.Invalid("repo_path %s: a path with ':' cannot be mounted into a sandbox", path)
		}
	}
	return r, nil
}

var hexRE = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// readSmall reads a small regular file written by the guest, refusing symlinks and anything
// that is not a plain file.
func readSmall(path string, max int64) (string, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() || fi.Size() > max {
		return "", fmt.Errorf("%s is not a small regular file", filepath.Base(path))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// ErrNoCommit means the guest's branch ref does not name a commit the host has.
var ErrNoCommit = errors.New("the guest's branch ref does not name a commit")
