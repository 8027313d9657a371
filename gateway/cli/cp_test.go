package cli

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type entry struct {
	name, link, body string
	typ              byte
	mode             int64
}

func tarOf(t *testing.T, entries ...entry) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return &b
}

// TestUntar: a directory comes out with its files, modes (setuid dropped) and inner links; what
// would land outside the destination, or write through a link, refuses the copy; absolute or
// escaping links, hard links and devices are left out with a warning.
func TestUntar(t *testing.T) {
	root := t.TempDir()
	var warn bytes.Buffer
	n, err := untar(tarOf(t,
		entry{name: "d/", typ: tar.TypeDir, mode: 0o750},
		entry{name: "d/run.sh", typ: tar.TypeReg, mode: 0o4755, body: "#!/bin/sh\n"},
		entry{name: "d/sub/ro.txt", typ: tar.TypeReg, mode: 0o444, body: "ro"},
		entry{name: "d/inner", typ: tar.TypeSymlink, link: "sub/ro.txt"},
		entry{name: "d/abs", typ: tar.TypeSymlink, link: "/etc/passwd"},
		entry{name: "d/up", typ: tar.TypeSymlink, link: "../../x"},
		entry{name: "d/hard", typ: tar.TypeLink, link: "d/run.sh"},
		entry{name: "d/null", typ: tar.TypeChar},
	), root, "d", &warn)
	if err != nil || n != int64(len("#!/bin/sh\n")+2) {
		t.Fatalf("untar: %d bytes, %v", n, err)
	}
	check := func(p string, mode fs.FileMode) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil || fi.Mode() != mode {
			t.Errorf("%s: %v %v, want %v", p, fi.Mode(), err, mode)
		}
	}
	check("d", fs.ModeDir|0o750)
	check("d/run.sh", 0o755)
	check("d/sub/ro.txt", 0o444)
	check("d/inner", fs.ModeSymlink|0o777)
	for _, gone := range []string{"d/abs", "d/up", "d/hard", "d/null"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); err == nil {
			t.Errorf("%s was unpacked", gone)
		}
		if !strings.Contains(warn.String(), gone) {
			t.Errorf("no warning for %s: %s", gone, warn.String())
		}
	}
	for _, tc := range []struct {
		entries []entry
		want    string
	}{
		{[]entry{{name: "../evil", typ: tar.TypeReg, body: "x"}}, "outside the destination"},
		{[]entry{{name: "/etc/evil", typ: tar.TypeReg, body: "x"}}, "outside the destination"},
		{[]entry{{name: "d/../../evil", typ: tar.TypeReg, body: "x"}}, "outside the destination"},
		{[]entry{{name: "other", typ: tar.TypeReg, body: "x"}}, "not under d"},
		{[]entry{{name: "d/l", typ: tar.TypeSymlink, link: "."}, {name: "d/l/x", typ: tar.TypeReg, body: "x"}}, "symbolic link"},
	} {
		dir := t.TempDir()
		if _, err := untar(tarOf(t, tc.entries...), dir, "d", &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.entries, err, tc.want)
		}
	}
}

// TestPlace: a directory merges into one that exists, a file replaces a file, and a type
// mismatch is refused.
func TestPlace(t *testing.T) {
	root := t.TempDir()
	src, dst := filepath.Join(root, "src"), filepath.Join(root, "dst")
	os.MkdirAll(filepath.Join(src, "a"), 0o755)
	os.WriteFile(filepath.Join(src, "a", "new"), []byte("new"), 0o644)
	os.WriteFile(filepath.Join(src, "f"), []byte("2"), 0o644)
	os.MkdirAll(filepath.Join(dst, "a"), 0o755)
	os.WriteFile(filepath.Join(dst, "a", "old"), []byte("old"), 0o644)
	os.WriteFile(filepath.Join(dst, "f"), []byte("1"), 0o644)
	if err := place(src, dst); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"a/new": "new", "a/old": "old", "f": "2"} {
		if b, _ := os.ReadFile(filepath.Join(dst, p)); string(b) != want {
			t.Errorf("%s: %q, want %q", p, b, want)
		}
	}
	os.MkdirAll(filepath.Join(root, "d2"), 0o755)
	os.WriteFile(filepath.Join(root, "file"), nil, 0o644)
	if err := place(filepath.Join(root, "file"), filepath.Join(root, "d2")); err == nil {
		t.Error("a file replaced a directory")
	}
}

// TestWriteTarRoundTrip: a host directory packed by writeTar unpacks to the same tree.
func TestWriteTarRoundTrip(t *testing.T) {
	src := filepath.Join(t.TempDir(), "proj")
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	os.WriteFile(filepath.Join(src, "bin", "tool"), []byte("run"), 0o750)
	os.Symlink("bin/tool", filepath.Join(src, "tool"))
	var b bytes.Buffer
	if _, err := writeTar(&b, src, "copy"); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if _, err := untar(&b, root, "copy", &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(root, "copy", "tool")); err != nil || fi.Mode() != 0o750 {
		t.Errorf("copy/tool: %v %v", fi, err)
	}
}
