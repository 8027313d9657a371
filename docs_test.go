package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// markdownLink matches an inline link or image target: [text](target) or [text](target "title").
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestDocsSelfContained checks the pages a user's clone carries: README.md, docs/*.md and
// deploy/README.md. None may point outside the repository (a clone has no ../shared), and every
// relative link must name a file or directory of the repository.
func TestDocsSelfContained(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("docs/ has no pages")
	}
	pages = append(pages, "README.md", "deploy/README.md")
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if strings.Contains(text, "../shared") {
			t.Errorf("%s points at ../shared, which a clone does not have", page)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
				continue
			}
			file, _, _ := strings.Cut(target, "#")
			abs, err := filepath.Abs(filepath.Join(filepath.Dir(page), file))
			if err != nil {
				t.Fatal(err)
			}
			if abs != root && !strings.HasPrefix(abs, root+string(filepath.Separator)) {
				t.Errorf("%s links to %s, outside the repository", page, target)
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, target)
			}
		}
	}
}

// TestDocsLinkCheckFails makes sure the link check above can fail: a link to a missing file and
// one out of the repository are both found.
func TestDocsLinkCheckFails(t *testing.T) {
	text := "see [a](docs/missing.md) and [b](../shared/DESIGN.md \"design\") and [c](https://x.example/y)"
	var targets []string
	for _, m := range markdownLink.FindAllStringSubmatch(text, -1) {
		targets = append(targets, m[1])
	}
	if strings.Join(targets, " ") != "docs/missing.md ../shared/DESIGN.md https://x.example/y" {
		t.Fatalf("links found: %q", targets)
	}
}
