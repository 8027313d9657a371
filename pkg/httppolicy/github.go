package httppolicy

import (
	"regexp"
	"strings"
)

// GitHub hosts whose requests the built-in repo policy judges.
const (
	GitHubWeb     = "github.com"
	GitHubAPI     = "api.github.com"
	GitHubUploads = "uploads.github.com"
)

// IsGitHubHost reports whether host takes `repos:` rules.
func IsGitHubHost(host string) bool {
	return host == GitHubWeb || host == GitHubAPI || host == GitHubUploads
}

var repoPartRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,100}$`)

// ParseRepo validates "owner/repo" and returns it in lower case (GitHub names are
// case-insensitive).
func ParseRepo(s string) (string, bool) {
	owner, repo, ok := strings.Cut(s, "/")
	if !ok || !repoPartRE.MatchString(owner) || !repoPartRE.MatchString(repo) || strings.Contains(s, "..") ||
		owner == "." || repo == "." {
		return "", false
	}
	return strings.ToLower(owner + "/" + repo), true
}

// smartHTTP kinds.
const (
	gitInfoRefs    = "info/refs"
	gitUploadPack  = "git-upload-pack"
	gitReceivePack = "git-receive-pack"
)

// githubRoute is what a github.com path addresses.
type githubRoute struct {
	repo     string // owner/repo, lower case; "" when the path names no repository
	smart    string // one of the smart-HTTP kinds, or ""
	artifact bool   // /<o>/<r>/archive/… or /<o>/<r>/releases/download/…
}

// parseGitHubPath classifies a canonical github.com path.
func parseGitHubPath(path string) githubRoute {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(segs) < 3 {
		return githubRoute{}
	}
	owner, name := segs[0], segs[1]
	// Compared case-insensitively, so that no spelling of a git endpoint escapes the repo check.
	gitSuffix := strings.HasSuffix(strings.ToLower(name), ".git")
	if gitSuffix {
		name = name[:len(name)-len(".git")]
	}
	repo, ok := ParseRepo(owner + "/" + name)
	if !ok {
		return githubRoute{}
	}
	rest := strings.ToLower(strings.Join(segs[2:], "/"))
	switch rest {
	case gitInfoRefs, gitUploadPack, gitReceivePack:
		return githubRoute{repo: repo, smart: rest}
	}
	if gitSuffix {
		return githubRoute{repo: repo}
	}
	switch {
	case segs[2] == "archive" && len(segs) >= 4 && segs[3] != "":
		return githubRoute{repo: repo, artifact: true}
	case len(segs) >= 5 && segs[2] == "releases" && segs[3] == "download" && segs[4] != "":
		return githubRoute{repo: repo, artifact: true}
	}
	return githubRoute{repo: repo}
}

// apiRepo returns the owner/repo of an api.github.com or uploads.github.com path
// /repos/<o>/<r>[/…] and what follows it.
func apiRepo(path string) (repo, rest string, ok bool) {
	segs := strings.SplitN(strings.TrimPrefix(path, "/"), "/", 4)
	if len(segs) < 3 || segs[0] != "repos" {
		return "", "", false
	}
	repo, ok = ParseRepo(segs[1] + "/" + segs[2])
	if len(segs) == 4 {
		rest = segs[3]
	}
	return repo, rest, ok
}
