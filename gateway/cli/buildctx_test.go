package cli

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/pkg/dockerfile"
)

func contextDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func dsts(items []copyItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.dst)
	}
	return out
}

func TestBuildContextCopyPlan(t *testing.T) {
	dir := contextDir(t, map[string]string{
		".dockerignore":    "# comment\n*.log\nbuild/\n!build/keep.txt\n**/tmp\n",
		"a.txt":            "a",
		"b.log":            "b",
		"src/main.go":      "m",
		"src/x/y.go":       "y",
		"src/x/tmp":        "t",
		"build/out.bin":    "o",
		"build/keep.txt":   "k",
		"src-other/z.go":   "z",
		"deep/er/file.txt": "f",
	})
	os.Symlink("/etc/passwd", filepath.Join(dir, "src", "escape"))
	bc, err := loadContext(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	plan := func(dest string, src ...string) []string {
		t.Helper()
		items, err := bc.copyPlan(dockerfile.Step{Cmd: "COPY", Sources: src, Dest: dest})
		if err != nil {
			t.Fatalf("COPY %v %s: %v", src, dest, err)
		}
		return dsts(items)
	}
	if got := plan("/app/", "src"); !slices.Equal(got, []string{"/app/escape", "/app/main.go", "/app/x", "/app/x/y.go"}) {
		t.Errorf("COPY src /app/ = %q (a directory's contents; **/tmp ignored)", got)
	}
	if got := plan("/etc/a", "a.txt"); !slices.Equal(got, []string{"/etc/a"}) {
		t.Errorf("COPY a.txt /etc/a = %q", got)
	}
	if got := plan("/d/", "*.txt", "deep/*/file.txt"); !slices.Equal(got, []string{"/d/a.txt", "/d/file.txt"}) {
		t.Errorf("COPY *.txt deep/*/file.txt /d/ = %q", got)
	}
	if got := plan("/b/", "build"); !slices.Equal(got, []string{"/b/keep.txt"}) {
		t.Errorf("COPY build /b/ = %q (only the exception survives)", got)
	}
	for _, src := range []string{"../x", "b.log", "nothing", "*.log"} {
		if _, err := bc.copyPlan(dockerfile.Step{Cmd: "COPY", Sources: []string{src}, Dest: "/"}); err == nil {
			t.Errorf("COPY %s was accepted", src)
		}
	}

	// The link is sent as a link; the content is read through the root, so a file swapped for
	// a link out of the context is refused.
	items, _ := bc.copyPlan(dockerfile.Step{Cmd: "COPY", Sources: []string{"src"}, Dest: "/app/"})
	var buf bytes.Buffer
	if err := bc.writeTar(&buf, items, false); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "app/escape" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/passwd") {
			t.Errorf("the link became %+v", h)
		}
		if h.Uid != 0 || h.Uname != "root" {
			t.Errorf("%s owned by %d/%s", h.Name, h.Uid, h.Uname)
		}
	}
	os.Remove(filepath.Join(dir, "src", "main.go"))
	os.Symlink("/etc/passwd", filepath.Join(dir, "src", "main.go"))
	if err := bc.writeTar(io.Discard, items, false); err == nil {
		t.Error("a file swapped for a link out of the context was read")
	}

}

// The cache key of a COPY follows contents and modes, not times.
func TestCopyDigest(t *testing.T) {
	dir := contextDir(t, map[string]string{"a.txt": "a"})
	bc, err := loadContext(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	items, _ := bc.copyPlan(dockerfile.Step{Cmd: "COPY", Sources: []string{"a.txt"}, Dest: "/a"})
	d1, err := bc.copyDigest(items)
	if err != nil {
		t.Fatal(err)
	}
	os.Chtimes(filepath.Join(dir, "a.txt"), time.Unix(1, 0), time.Unix(1, 0))
	if d2, _ := bc.copyDigest(items); d2 != d1 {
		t.Error("a touched file changed the cache key")
	}
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("b"), 0o644)
	if d3, _ := bc.copyDigest(items); d3 == d1 {
		t.Error("a changed file kept the cache key")
	}
}

func TestBuildContextBounds(t *testing.T) {
	dir := contextDir(t, map[string]string{"big": strings.Repeat("x", 4096)})
	if _, err := loadContext(dir, 1024); err == nil || !strings.Contains(err.Error(), "--max-context") {
		t.Errorf("an oversized context: %v", err)
	}
	if _, err := loadContext(filepath.Join(dir, "missing"), 0); err == nil {
		t.Error("a missing context was accepted")
	}
}
