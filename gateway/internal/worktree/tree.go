// Package worktree is the host side of worktree delegation (seed "worktree-native parallel
// flow"): a git worktree of a host repository on its own branch nexus/<name>, the view of the
// repository's git dir that the delegation's sandbox sees, and the host's reading of what the
// guest did (its branch, log and status).
//
// The worktree's .git file names its git dir by host path. The guest sees, at that same path:
//   - the worktree's own git dir (HEAD, index), read-write;
//   - in place of the repository's .git, a read-only view written here (a minimal config: no
//     hooks, no remotes, no credentials of the host repo), with read-write mounts of the
//     repository's objects and of a per-delegation refs/heads/nexus directory holding only this
//     delegation's branch.
//
// The host copies the guest's branch ref into the repository (after checking that it names a
// commit) when it is asked (Sync). Host git never reads configuration from a guest-writable
// place (see git.go). The package holds no locks: its caller serialises the operations on one
// tree and the ones that change a repository.
package worktree

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Workspace is where the worktree is mounted in the guest.
const Workspace = "/workspace"

// BranchPrefix starts the branch of every delegation.
const BranchPrefix = "nexus/"

// Tree is one delegation's worktree: where it is, what it came from, and the working directory
// Dir that holds the guest's and the host's views of the repository's git dir.
type Tree struct {
	Name      string `json:"name"`
	Repo      string `json:"repo"`
	CommonDir string `json:"common_dir"`
	GitDir    string `json:"git_dir"` // the worktree's own git dir, under CommonDir/worktrees
	Worktree  string `json:"worktree"`
	Branch    string `json:"branch"`
	Base      string `json:"base"` // the commit the branch started at
	// Synced is the guest's branch ref as last copied into the repository.
	Synced string `json:"synced"`
	// Dir is the working directory; it follows from the name and is not recorded.
	Dir string `json:"-"`
}

// New describes the tree of delegation name of repo, with its worktree at path and its
// working files in dir; Add creates it.
func New(repo Repo, name, path, dir string) *Tree {
	return &Tree{Name: name, Repo: repo.Top, CommonDir: repo.CommonDir, Branch: BranchPrefix + name, Worktree: path, Dir: dir}
}

func (t *Tree) guestView() string { return filepath.Join(t.Dir, "guestgit") }
func (t *Tree) hostView() string  { return filepath.Join(t.Dir, "hostgit") }
func (t *Tree) refsDir() string   { return filepath.Join(t.Dir, "refs") }
func (t *Tree) logsDir() string   { return filepath.Join(t.Dir, "logs") }
func (t *Tree) ref() string       { return "refs/heads/" + t.Branch }
func (t *Tree) short() string     { return strings.TrimPrefix(t.Branch, BranchPrefix) }

// GuestRef is the file in which the guest's git keeps the delegation's branch ref.
func (t *Tree) GuestRef() string { return filepath.Join(t.refsDir(), t.short()) }

// Add creates the branch at base, the worktree on it and the guest's view. Dir must exist. On
// failure the caller runs Discard.
func (t *Tree) Add(ctx context.Context, base string) error {
	sha, err := runGit(ctx, nil, "-C", t.Repo, "rev-parse", "--verify", "--end-of-options", base+"^{commit}")
	if err != nil {
		return errdefs.Invalid("base %q is not a commit of %s", base, t.Repo)
	}
	t.Base = strings.TrimSpace(sha)
	t.Synced = t.Base
	if _, err := runGit(ctx, nil, "-C", t.Repo, "rev-parse", "--verify", "--quiet", t.ref()); err == nil {
		return errdefs.Conflict("branch %s already exists in %s", t.Branch, t.Repo)
	}
	if _, err := runGit(ctx, nil, "-C", t.Repo, "worktree", "add", "-b", t.Branch, t.Worktree, t.Base); err != nil {
		return errdefs.Conflict("create the worktree: %v", err)
	}
	gitdir, err := readSmall(filepath.Join(t.Worktree, ".git"), 4096)
	if err != nil || !strings.HasPrefix(gitdir, "gitdir: ") {
		return fmt.Errorf("create the worktree: unexpected %s/.git", t.Worktree)
	}
	t.GitDir = filepath.Clean(strings.TrimPrefix(gitdir, "gitdir: "))
	if err := t.prepareViews(ctx); err != nil {
		return fmt.Errorf("prepare the guest's git view: %w", err)
	}
	return nil
}

// Mounts lists the sandbox's mounts (host:guest[:ro]), outermost first (the vmm mounts them in
// order).
func (t *Tree) Mounts() []string {
	return []string{
		t.Worktree + ":" + Workspace,
		t.guestView() + ":" + t.CommonDir + ":ro",
		filepath.Join(t.CommonDir, "objects") + ":" + filepath.Join(t.CommonDir, "objects"),
		t.refsDir() + ":" + filepath.Join(t.CommonDir, "refs", "heads", "nexus"),
		t.logsDir() + ":" + filepath.Join(t.CommonDir, "logs", "refs", "heads", "nexus"),
		t.GitDir + ":" + t.GitDir,
	}
}

// prepareViews writes the guest's read-only view of the repository's git dir, the guest's
// private branch ref and reflog directories, and the host's view used to inspect the worktree.
func (t *Tree) prepareViews(ctx context.Context) error {
	gv := t.guestView()
	rel, err := filepath.Rel(t.CommonDir, t.GitDir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("worktree git dir %s is not under %s", t.GitDir, t.CommonDir)
	}
	for _, p := range []string{filepath.Join(gv, "objects"), filepath.Join(gv, "refs", "heads", "nexus"), filepath.Join(gv, "refs", "tags"),
		filepath.Join(gv, "logs", "refs", "heads", "nexus"), filepath.Join(gv, rel), t.refsDir(), t.logsDir(), t.hostView()} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	version, _ := runGit(ctx, nil, "--git-dir="+t.CommonDir, "config", "--get", "core.repositoryformatversion")
	format, _ := runGit(ctx, nil, "--git-dir="+t.CommonDir, "config", "--get", "extensions.objectformat")
	cfg := "[core]\n\trepositoryformatversion = " + orDefault(strings.TrimSpace(version), "0") +
		"\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"
	if f := strings.TrimSpace(format); f != "" {
		cfg += "[extensions]\n\tobjectformat = " + f + "\n"
	}
	files := map[string]string{
		filepath.Join(gv, "config"):              cfg,
		filepath.Join(gv, "HEAD"):                "ref: " + t.ref() + "\n",
		t.GuestRef():                             t.Base + "\n",
		filepath.Join(t.hostView(), "HEAD"):      "ref: " + t.ref() + "\n",
		filepath.Join(t.hostView(), "commondir"): t.CommonDir + "\n",
	}
	for p, content := range files {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Discard undoes Add: the worktree and the branch go.
func (t *Tree) Discard(ctx context.Context) {
	if _, err := os.Stat(t.Worktree); err != nil {
		return
	}
	runGit(ctx, nil, "-C", t.Repo, "worktree", "remove", "--force", t.Worktree)
	os.RemoveAll(t.Worktree)
	runGit(ctx, nil, "-C", t.Repo, "worktree", "prune")
	runGit(ctx, nil, "-C", t.Repo, "branch", "-D", "--end-of-options", t.Branch)
}

// Remove removes the worktree and keeps the branch. It never asks git whether the worktree is
// clean (--force): that check would run git with the worktree's guest-writable git dir.
func (t *Tree) Remove(ctx context.Context, log zerolog.Logger) error {
	if _, err := runGit(ctx, nil, "-C", t.Repo, "worktree", "remove", "--force", t.Worktree); err != nil {
		log.Info().Err(err).Str("worktree", t.Worktree).Msg("git worktree remove failed; removing the directory")
		if err := os.RemoveAll(t.Worktree); err != nil {
			return fmt.Errorf("remove worktree %s: %w", t.Worktree, err)
		}
		runGit(ctx, nil, "-C", t.Repo, "worktree", "prune")
	}
	return nil
}

// Sync copies the guest's branch ref into the repository when the guest moved it and it names
// a commit the repository has; the branch never moves to anything else, and commits made on
// the host are kept until the guest moves its branch again. It reports whether Synced changed
// (the caller records it).
func (t *Tree) Sync(ctx context.Context) (bool, error) {
	sha, err := readSmall(t.GuestRef(), 128)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil // the guest deleted its branch: keep the host's
		}
		return false, err
	}
	if sha == t.Synced {
		return false, nil
	}
	if !hexRE.MatchString(sha) {
		return false, ErrNoCommit
	}
	if _, err := runGit(ctx, nil, "--git-dir="+t.CommonDir, "cat-file", "-e", sha+"^{commit}"); err != nil {
		return false, ErrNoCommit
	}
	if _, err = runGit(ctx, nil, "--git-dir="+t.CommonDir, "update-ref", "-m", "nexus: delegation "+t.Name, t.ref(), sha); err != nil {
		return false, err
	}
	t.Synced = sha
	return true, nil
}

// Status is git status --porcelain of the worktree against the branch, read with the host's
// configuration only.
func (t *Tree) Status(ctx context.Context) ([]string, error) {
	env := []string{"GIT_DIR=" + t.hostView(), "GIT_WORK_TREE=" + t.Worktree}
	index := filepath.Join(t.GitDir, "index")
	if fi, err := os.Lstat(index); err == nil {
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("the worktree's index is not a regular file")
		}
		env = append(env, "GIT_INDEX_FILE="+index)
	} else {
		env = append(env, "GIT_INDEX_FILE="+filepath.Join(t.Dir, "empty-index"))
	}
	args := append(append([]string{}, safeGitConfig...), "status", "--porcelain", "--ignore-submodules=all")
	out, err := runGit(ctx, env, args...)
	if err != nil {
		return nil, err
	}
	return lines(out, true), nil
}

// Changed is the paths that Status lists.
func Changed(status []string) []string {
	var out []string
	for _, l := range status {
		if len(l) > 3 {
			out = append(out, l[3:])
		}
	}
	return out
}

// Log is the branch's recent commits, one "sha subject" line each.
func (t *Tree) Log(ctx context.Context, n int) ([]string, error) {
	out, err := runGit(ctx, nil, append(append([]string{"--git-dir=" + t.CommonDir}, safeGitConfig...),
		"log", "--format=%h %s", "-n", strconv.Itoa(n), t.ref(), "--")...)
	if err != nil {
		return nil, err
	}
	return lines(out, false), nil
}

// lines splits git output into its non-empty lines (blank ones too when trim is set).
func lines(out string, trim bool) []string {
	ls := []string{}
	for _, l := range strings.Split(out, "\n") {
		if l == "" || trim && strings.TrimSpace(l) == "" {
			continue
		}
		ls = append(ls, l)
	}
	return ls
}

// Head is what the worktree has checked out: a branch name, or a commit when detached.
func (t *Tree) Head() string {
	h, err := readSmall(filepath.Join(t.GitDir, "HEAD"), 512)
	if err != nil {
		return ""
	}
	if ref, ok := strings.CutPrefix(h, "ref: refs/heads/"); ok {
		return ref
	}
	if hexRE.MatchString(h) {
		return h
	}
	return ""
}

// BranchHead is the commit the repository's branch names, or "" when it has none.
func (t *Tree) BranchHead(ctx context.Context) string {
	head, _ := runGit(ctx, nil, "--git-dir="+t.CommonDir, "rev-parse", "--verify", "--quiet", t.ref())
	return strings.TrimSpace(head)
}
